# mmdet's own DINO-4scale R50 on COCO, its MultiScaleDeformableAttention
# running mmcv's CUDA kernels: the baseline of msda_mm's dino_fp32.py.  On
# mmcv-lite those kernels are msda_mm's build of them from the mmcv sdist
# (python tools/build_mmcv_msda.py --sdist mmcv-2.1.0.tar.gz, once per GPU);
# with compiled mmcv they are its own.  Only what runs here differs from mmdet.
_base_ = ['mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py', './_recipe.py']
custom_imports = dict(imports=['msda_mm', 'msda_mm.compat.with_mmcv_cuda'],
                      allow_failed_imports=False)

# Nothing is downloaded at run time (as in dino_fp32.py): random backbone weights.
model = dict(backbone=dict(init_cfg=None))
default_hooks = dict(checkpoint={{_base_.verified_checkpoint}})
