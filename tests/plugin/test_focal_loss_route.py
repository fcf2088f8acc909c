"""mmdet's CUDA sigmoid-focal-loss path (what the DETR heads run on GPU)
computes in PyTorch when mmcv has no compiled ops."""
import pytest
import torch
from mmdet.models.losses import FocalLoss, focal_loss

from msda_mm.compat import MMCV_LITE
from msda_mm.compat.focal_loss import sigmoid_focal_loss_from_labels

pytestmark = pytest.mark.skipif(
    not MMCV_LITE, reason="a compiled mmcv._ext is installed: mmcv's focal loss is used")

NUM_CLASSES = 5


def logits_and_labels(n=7):
    torch.manual_seed(0)
    pred = torch.randn(n, NUM_CLASSES, dtype=torch.float64, requires_grad=True)
    # Label NUM_CLASSES is background, as the DETR heads assign unmatched queries.
    labels = torch.tensor([0, 4, 5, 2, 5, 1, 3])[:n]
    return pred, labels


def focal_by_definition(pred, labels, gamma=2.0, alpha=0.25):
    # Lin et al.: -alpha (1-p)^g log p for the positive class,
    # -(1-alpha) p^g log(1-p) for the others (all of them for background).
    p = pred.sigmoid()
    positive = labels[:, None] == torch.arange(NUM_CLASSES)
    return torch.where(positive, -alpha * (1 - p) ** gamma * torch.log(p),
                       -(1 - alpha) * p ** gamma * torch.log1p(-p))


def test_mmdet_cuda_branch_calls_pytorch_loss():
    assert focal_loss._sigmoid_focal_loss is sigmoid_focal_loss_from_labels
    pred, labels = logits_and_labels()
    # FocalLoss.forward runs exactly this function for CUDA logits; with CPU
    # tensors it would hit the stub's RuntimeError if it were not routed.
    loss = focal_loss.sigmoid_focal_loss(pred, labels, reduction="none")
    torch.testing.assert_close(loss, focal_by_definition(pred, labels))


def test_cuda_branch_matches_focal_loss_cpu_branch():
    # The module's CPU branch (one-hot + py_sigmoid_focal_loss) and its CUDA
    # branch must agree, weights, avg_factor and gradients included.
    pred, labels = logits_and_labels()
    weight = torch.rand(len(labels), dtype=torch.float64)
    cpu_loss = FocalLoss(use_sigmoid=True)(pred, labels, weight, avg_factor=3.0)
    (cpu_grad,) = torch.autograd.grad(cpu_loss, pred)
    cuda_branch_loss = focal_loss.sigmoid_focal_loss(pred, labels, weight, avg_factor=3.0)
    (cuda_branch_grad,) = torch.autograd.grad(cuda_branch_loss, pred)
    torch.testing.assert_close(cuda_branch_loss, cpu_loss)
    torch.testing.assert_close(cuda_branch_grad, cpu_grad)


def test_unserved_arguments_raise():
    pred, labels = logits_and_labels()
    with pytest.raises(ValueError, match="reduction='mean'"):
        sigmoid_focal_loss_from_labels(pred, labels, 2.0, 0.25, None, "mean")
    with pytest.raises(ValueError, match=r"target \(N,\)"):
        sigmoid_focal_loss_from_labels(pred, labels[:3])


@pytest.mark.gpu
def test_focal_loss_on_cuda_without_compiled_mmcv():
    pred, labels = logits_and_labels()
    loss = FocalLoss(use_sigmoid=True)(pred.cuda(), labels.cuda())
    torch.testing.assert_close(loss.cpu(), FocalLoss(use_sigmoid=True)(pred, labels))
