# DINO-4scale R50 on the synthetic shapes data with every training step
# replayed from CUDA graphs, as configs/dino_bf16_graphed.py takes it.
_base_ = './dino_r50_synthetic_fastest.py'

model = {{_base_.synthetic_graphed_model}}
