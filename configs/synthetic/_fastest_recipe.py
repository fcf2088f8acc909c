# configs/dino_bf16_fastest.py's recipe as pieces for the synthetic configs
# (a fragment: `{{_base_.fastest_model}}` and the like take them in).
fastest_model = dict(
    type='SyncFreeDINO',
    data_preprocessor=dict(type='SyncFreeDetDataPreprocessor'),
    bbox_head=dict(
        type='BatchedMatchingDINOHead',
        compile_losses=True,
        loss_cls=dict(type='SyncFreeFocalLoss'),
        loss_bbox=dict(type='SyncFreeL1Loss'),
        loss_iou=dict(type='SyncFreeGIoULoss')))
fastest_optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16',
                             optimizer=dict(fused=True),
                             constructor='MergedGroupsOptimWrapperConstructor')
compile_layers_hook = dict(type='CompileSubmodulesHook',
                           modules=['encoder.layers', 'decoder.layers'])
