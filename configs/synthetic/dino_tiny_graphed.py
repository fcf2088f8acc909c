# The CPU demo's model on a GPU with every training step replayed from CUDA
# graphs, as configs/dino_bf16_graphed.py takes it.
_base_ = './dino_tiny_fastest.py'

model = {{_base_.tiny_graphed_model}}
