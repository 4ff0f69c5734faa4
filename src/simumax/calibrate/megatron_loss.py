"""Megatron's unfused cross-entropy at tensor-parallel size 1, in plain PyTorch.

The same kernel chain as megatron/core/tensor_parallel/cross_entropy.py
(``VocabParallelCrossEntropy``; Megatron-LM's mpu/cross_entropy.py before it) without the
TP all-reduces: an fp32 copy of the logits, max over the vocabulary, subtract it in
place, exp in place, sum, divide in place (the softmax, saved); backward lowers the target
entries of the saved softmax, scales it in place by the loss gradient, and the copy's
backward casts it to the logits' dtype. ``graph.blocks.megatron_ce_traffic`` counts its
bytes; ``calibrate`` times it for the ``ce`` line and ``check-step`` trains with it.
"""

from __future__ import annotations

from typing import Any

import torch


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # fp32 logits
        logits_max = torch.max(logits, dim=-1)[0]
        logits -= logits_max.unsqueeze(dim=-1)
        rows = torch.arange(logits.size(0), device=logits.device)
        predicted = logits[rows, target].clone()
        torch.exp(logits, out=logits)
        sum_exp = logits.sum(dim=-1)
        loss = torch.log(sum_exp) - predicted
        logits.div_(sum_exp.unsqueeze(dim=-1))
        ctx.save_for_backward(logits, target)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None]:
        softmax, target = ctx.saved_tensors
        grad = softmax
        rows = torch.arange(grad.size(0), device=grad.device)
        grad[rows, target] -= 1.0
        grad.mul_(grad_loss.unsqueeze(dim=-1))
        return grad, None


def megatron_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-token losses of [tokens, vocab] logits (any float dtype) for [tokens] targets."""
    return _CrossEntropy.apply(logits.float(), target)
