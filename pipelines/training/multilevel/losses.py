"""The loss terms: CLIP at one level, cross-level alignment of a parent with its pooled children,
and the hard-negative terms (logistic pairwise or NegCLIP softmax)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional


def clip_loss(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE between row-aligned, L2-normalized ``a`` and ``b`` (CLIP's loss)."""
    logits = scale * a @ b.T
    target = torch.arange(a.shape[0], device=a.device)
    return (functional.cross_entropy(logits, target) + functional.cross_entropy(logits.T, target)) / 2


def pooled_children(children: torch.Tensor, groups: list[int], parents: int) -> torch.Tensor:
    """Average pooling of each parent's child embeddings (Panel2Patch's v-bar), re-normalized so
    the CLIP loss compares cosines; ``groups[k]`` is the parent index of child ``k``."""
    index = torch.tensor(groups, device=children.device, dtype=torch.long)
    sums = torch.zeros(parents, children.shape[1], device=children.device, dtype=children.dtype)
    sums = sums.index_add(0, index, children)
    return functional.normalize(sums, dim=-1)


def cross_level_loss(
    parent_img: torch.Tensor,
    parent_txt: torch.Tensor,
    child_img: torch.Tensor,
    child_txt: torch.Tensor,
    groups: list[int],
    scale: torch.Tensor | float,
    gather: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
) -> torch.Tensor | None:
    """Panel2Patch's L_inter = L_CLIP({v_parent}, {mean v_child}) + L_CLIP({t_parent}, {mean t_child})
    over the parents that have at least one child in ``groups`` (key design 3). ``gather`` joins
    the (parent, pooled children) rows of every rank before the loss (DDP); None when no rank
    has a parent with children."""
    present = sorted(set(groups))
    remap = {p: i for i, p in enumerate(present)}
    local = [remap[g] for g in groups]
    keep = torch.tensor(present, device=parent_img.device, dtype=torch.long)
    v_bar = pooled_children(child_img, local, len(present))
    t_bar = pooled_children(child_txt, local, len(present))
    rows = [gather(x) for x in (parent_img[keep], v_bar, parent_txt[keep], t_bar)]
    if rows[0].shape[0] == 0:
        return None
    return clip_loss(rows[0], rows[1], scale) + clip_loss(rows[2], rows[3], scale)


def negative_sigmoid_loss(
    img: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, mask: torch.Tensor, tau: float
) -> torch.Tensor:
    """Mean over (region, hard negative) of -log sigmoid((s(r, t+) - s(r, t-)) / tau): a soft
    margin that grows as a negative's similarity nears or passes the positive's. ``neg`` is
    (regions, K, d), ``mask`` (regions, K) marks real negatives; no negative at all gives 0."""
    if not bool(mask.any()):
        return img.sum() * 0.0
    s_pos = (img * pos).sum(-1, keepdim=True)  # (R, 1)
    s_neg = torch.einsum("rd,rkd->rk", img, neg)
    terms = -functional.logsigmoid((s_pos - s_neg) / tau)
    return terms[mask].mean()


def negative_softmax_loss(
    img: torch.Tensor, txt: torch.Tensor, neg: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor | float
) -> torch.Tensor:
    """Image -> text InfoNCE of the regions whose softmax also holds their own hard negatives as
    extra logits (NegCLIP): row r is [s(r, t_1..t_B), s(r, neg_r1..neg_rK)], target r."""
    in_batch = scale * img @ txt.T
    extra = (scale * torch.einsum("rd,rkd->rk", img, neg)).masked_fill(~mask, float("-inf"))
    target = torch.arange(img.shape[0], device=img.device)
    return functional.cross_entropy(torch.cat([in_batch, extra], dim=1), target)
