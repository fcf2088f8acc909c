"""mmdet's DINO without the transformer's waits on the device outside the head.

mmdet iterates the levels' (H, W) as a device tensor where it needs them as
numbers: the encoder's reference points and the encoder's output proposals
read them by ``linspace`` (a scalar read each, per level), its
``pre_transformer`` copies each level's (H, W) to the device on its own (a
blocking copy per level), and its denoising query generator copies a factor
per image and counts queries on the device.
Here the levels' sizes are kept as the Python ints mmdet reads them from (the
feature maps' shapes) for those two, the (H, W) tensor still goes to the
attention layers, and the denoising queries come from
``SyncFreeCdnQueryGenerator``.  Each tensor is computed by mmdet's operations
on the same numbers (an int and the 0-d tensor holding it give the same
float32 product), so the outputs and losses are DINO's.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import compat  # noqa: F401  (first: on mmcv-lite, mmdet.models imports only after it)

# isort: split
from mmdet.models.detectors import DINO
from mmdet.models.layers import DeformableDetrTransformerEncoder
from mmdet.registry import MODELS
from mmdet.structures import OptSampleList

from ...ops.validate import level_starts
from .cdn_query_generator import SyncFreeCdnQueryGenerator
from .one_copy import to_device
from .padded_batch import PaddedBatch

LevelSizes = Sequence[Tuple[int, int]]


@MODELS.register_module()
class SyncFreeDINO(DINO):
    """``DINO`` whose encoder reference points, encoder output proposals and
    denoising queries wait on the device once a step (the label noise's
    ``nonzero``) instead of 9 * L + about 3 * B times (L levels, B images).
    Same arguments, parameters (state_dict keys), random draws, outputs and
    losses as ``DINO``.

    Args:
        label_noise_draws: "mmdet" (DINO's draws) or "every_query" (the
            denoising label noise without its one wait, the same
            distribution drawn otherwise: SyncFreeCdnQueryGenerator).
    """

    def __init__(self, *args, label_noise_draws: str = "mmdet", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # DINO's generator replaced, its label embedding kept; the new one is
        # built under fork_rng, so that DINO's random draws stay DINO's.
        generator = self.dn_query_generator
        with torch.random.fork_rng(devices=[]):
            self.dn_query_generator = SyncFreeCdnQueryGenerator(
                num_classes=generator.num_classes, embed_dims=generator.embed_dims,
                num_matching_queries=generator.num_matching_queries,
                label_noise_scale=generator.label_noise_scale,
                box_noise_scale=generator.box_noise_scale,
                group_cfg=_group_cfg(generator), label_noise_draws=label_noise_draws)
        self.dn_query_generator.label_embedding = generator.label_embedding
        self._level_cache: Dict[tuple, Tuple[Tensor, Tensor]] = {}

    def pre_transformer(self, mlvl_feats: Tuple[Tensor],
                        batch_data_samples: OptSampleList = None) -> Tuple[Dict, Dict]:
        """``DeformableDETR.pre_transformer`` with the levels' (H, W) sent to
        the device in one non-blocking copy (mmdet copies each level's from
        pageable memory: a wait per level); its encoder inputs also hold
        ``level_sizes``: each level's (H, W) as ints."""
        if batch_data_samples is None:
            raise ValueError("SyncFreeDINO.pre_transformer needs batch_data_samples (the "
                             "images' sizes make the padding masks)")
        batch_size = mlvl_feats[0].size(0)
        masks = _padding_masks(mlvl_feats[0], batch_data_samples)
        if masks is None:
            mlvl_masks = [None] * len(mlvl_feats)
            mlvl_pos_embeds = [self.positional_encoding(None, input=feat) for feat in mlvl_feats]
        else:
            mlvl_masks = [F.interpolate(masks[None], size=feat.shape[-2:]).to(torch.bool)
                          .squeeze(0) for feat in mlvl_feats]
            mlvl_pos_embeds = [self.positional_encoding(mask) for mask in mlvl_masks]
        level_sizes = tuple(tuple(feat.shape[-2:]) for feat in mlvl_feats)
        spatial_shapes, level_start_index = self._level_tensors(level_sizes,
                                                                mlvl_feats[0].device)
        feat_flatten, lvl_pos_embed_flatten = [], []
        for lvl, (feat, pos_embed) in enumerate(zip(mlvl_feats, mlvl_pos_embeds)):
            c = feat.shape[1]
            feat_flatten.append(feat.view(batch_size, c, -1).permute(0, 2, 1))
            lvl_pos_embed_flatten.append(pos_embed.view(batch_size, c, -1).permute(0, 2, 1)
                                         + self.level_embed[lvl].view(1, 1, -1))
        feat_flatten = torch.cat(feat_flatten, 1)
        lvl_pos_embed_flatten = torch.cat(lvl_pos_embed_flatten, 1)
        mask_flatten = (None if mlvl_masks[0] is None
                        else torch.cat([mask.flatten(1) for mask in mlvl_masks], 1))
        if mlvl_masks[0] is not None:
            valid_ratios = torch.stack([self.get_valid_ratio(m) for m in mlvl_masks], 1)
        else:
            valid_ratios = mlvl_feats[0].new_ones(batch_size, len(mlvl_feats), 2)
        encoder_inputs = dict(feat=feat_flatten, feat_mask=mask_flatten,
                              feat_pos=lvl_pos_embed_flatten, spatial_shapes=spatial_shapes,
                              level_start_index=level_start_index, valid_ratios=valid_ratios,
                              level_sizes=level_sizes)
        decoder_inputs = dict(memory_mask=mask_flatten, spatial_shapes=spatial_shapes,
                              level_start_index=level_start_index, valid_ratios=valid_ratios)
        return encoder_inputs, decoder_inputs

    def _level_tensors(self, level_sizes: LevelSizes,
                       device: torch.device) -> Tuple[Tensor, Tensor]:
        """The levels' (H, W) (L, 2) and starts (L,) as int64 tensors on
        ``device``, sent in one non-blocking copy the first time and kept:
        a captured step must not copy from the host (its graph would read
        the pinned buffer again at every replay, long after it was reused)."""
        key = (level_sizes, device)
        if key not in self._level_cache:
            # The levels' starts too are known on the host: the same copy brings them.
            self._level_cache[key] = tuple(to_device(
                [torch.tensor(level_sizes, dtype=torch.long),
                 torch.tensor(level_starts(level_sizes), dtype=torch.long)], device))
        return self._level_cache[key]

    def padded_loss(self, batch: PaddedBatch) -> Dict[str, Tensor]:
        """``loss`` of a PaddedBatch: mmdet's DINO losses in static shapes
        with no host read (the canvas's padding masked as mmdet masks a
        batch's, the GT padding weighing nothing), what a captured training
        step computes.  The bbox head must be a BatchedMatchingDINOHead."""
        img_feats = self.extract_feat(batch.images)
        head_inputs = self.forward_transformer(img_feats, batch)
        return self.bbox_head.loss(**head_inputs, batch_data_samples=batch)

    def forward_encoder(self, feat: Tensor, feat_mask: Optional[Tensor], feat_pos: Tensor,
                        spatial_shapes: Tensor, level_start_index: Tensor,
                        valid_ratios: Tensor, level_sizes: LevelSizes) -> Dict:
        """``DeformableDETR.forward_encoder`` with the encoder's reference
        points made from ``level_sizes``; the outputs' ``spatial_shapes``
        (read by ``pre_decoder``'s proposals only) are ``level_sizes``."""
        # mmdet's own function, on ints instead of the tensor's 0-d entries.
        reference_points = DeformableDetrTransformerEncoder.get_encoder_reference_points(
            level_sizes, valid_ratios, device=feat.device)
        memory = feat
        for layer in self.encoder.layers:  # DeformableDetrTransformerEncoder.forward
            memory = layer(query=memory, query_pos=feat_pos, key_padding_mask=feat_mask,
                           spatial_shapes=spatial_shapes, level_start_index=level_start_index,
                           valid_ratios=valid_ratios, reference_points=reference_points)
        return dict(memory=memory, memory_mask=feat_mask, spatial_shapes=level_sizes)

    def gen_encoder_output_proposals(self, memory: Tensor, memory_mask: Optional[Tensor],
                                     spatial_shapes: LevelSizes) -> Tuple[Tensor, Tensor]:
        """``DeformableDETR.gen_encoder_output_proposals``, with
        ``spatial_shapes`` the levels' (H, W) as ints; without a mask the
        levels' (W, H) come in one non-blocking copy (mmdet's ``new_tensor``
        of a pair waits, once per level)."""
        bs = memory.size(0)
        if memory_mask is None:
            sizes = torch.tensor(spatial_shapes, dtype=torch.long).flip(-1)
            (whole_scale,) = to_device([sizes], memory.device)
        proposals, start = [], 0
        for lvl, (h, w) in enumerate(spatial_shapes):
            if memory_mask is not None:
                mask = memory_mask[:, start:start + h * w].view(bs, h, w, 1)
                valid_h = torch.sum(~mask[:, :, 0, 0], 1).unsqueeze(-1)
                valid_w = torch.sum(~mask[:, 0, :, 0], 1).unsqueeze(-1)
                scale = torch.cat([valid_w, valid_h], 1).view(bs, 1, 1, 2)
            else:
                scale = whole_scale[lvl].view(1, 1, 1, 2)
            grid_y, grid_x = torch.meshgrid(
                torch.linspace(0, h - 1, h, dtype=torch.float32, device=memory.device),
                torch.linspace(0, w - 1, w, dtype=torch.float32, device=memory.device),
                indexing="ij")
            grid = torch.cat([grid_x.unsqueeze(-1), grid_y.unsqueeze(-1)], -1)
            grid = (grid.unsqueeze(0).expand(bs, -1, -1, -1) + 0.5) / scale
            wh = torch.ones_like(grid) * 0.05 * (2.0 ** lvl)
            proposals.append(torch.cat((grid, wh), -1).view(bs, -1, 4))
            start += h * w
        return self._masked_proposals(memory, memory_mask, torch.cat(proposals, 1))

    def _masked_proposals(self, memory: Tensor, memory_mask: Optional[Tensor],
                          proposals: Tensor) -> Tuple[Tensor, Tensor]:
        """The tail of ``DeformableDETR.gen_encoder_output_proposals``: the
        proposals (bs, N, 4) in inverse-sigmoid space, inf where masked or
        out of (0.01, 0.99), and the memory zeroed there, transformed."""
        valid = ((proposals > 0.01) & (proposals < 0.99)).sum(
            -1, keepdim=True) == proposals.shape[-1]
        proposals = torch.log(proposals / (1 - proposals))
        output_memory = memory
        if memory_mask is not None:
            proposals = proposals.masked_fill(memory_mask.unsqueeze(-1), float("inf"))
            output_memory = output_memory.masked_fill(memory_mask.unsqueeze(-1), float(0))
        proposals = proposals.masked_fill(~valid, float("inf"))
        output_memory = output_memory.masked_fill(~valid, float(0))
        output_memory = self.memory_trans_norm(self.memory_trans_fc(output_memory))
        return output_memory, proposals


def _padding_masks(feat: Tensor, batch_data_samples) -> Optional[Tensor]:
    """(B, H, W) in ``feat``'s dtype, non-zero where an image is padded (as
    in the official DETR repo), or None where no image is: the masks of
    DeformableDETR.pre_transformer.  A PaddedBatch always has them (its
    shapes do not depend on its images' sizes)."""
    if isinstance(batch_data_samples, PaddedBatch):
        return batch_data_samples.masks().to(feat.dtype)
    input_h, input_w = batch_data_samples[0].batch_input_shape
    img_shapes = [sample.img_shape for sample in batch_data_samples]
    if torch.onnx.is_in_onnx_export() or all(
            h == input_h and w == input_w for h, w in img_shapes):
        return None
    masks = feat.new_ones((feat.size(0), input_h, input_w))
    for img_id, (img_h, img_w) in enumerate(img_shapes):
        masks[img_id, :img_h, :img_w] = 0
    return masks


def _group_cfg(generator) -> Dict:
    """The ``group_cfg`` that builds ``generator``'s grouping again."""
    if generator.dynamic_dn_groups:
        return dict(dynamic=True, num_dn_queries=generator.num_dn_queries)
    return dict(dynamic=False, num_groups=generator.num_groups)

