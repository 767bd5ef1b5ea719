"""Attention over a long sequence processed in segments, with gradients into the earlier segments' K/V.

A training forward over T positions keeps activations for all T. Processed in segments of S positions, a
segment's queries need the keys/values of every earlier position; ``SegmentKV`` holds them (one buffer of
``[rows, kv_heads, width, head_dim]`` per layer, the K/V a no-grad pass over the earlier segments wrote),
and ``attend`` computes

    out = softmax(q [k_prefix ; k_own]^T / sqrt(d) + causal) [v_prefix ; v_own]

as two flash attentions merged by their log-sum-exp (no ``S x T`` mask or score matrix is kept). Its
backward is exact: with the merged output ``o`` and log-sum-exp ``l`` of every query, the flash backward
over one block of keys returns that block's share of ``dq`` and the block's ``dk, dv`` (the split ring
attention uses). The prefix's ``dk, dv`` are added into gradient buffers beside the K/V; when the driver
later recomputes an earlier segment with grad, its own keys' gradient is the local one plus what every
later segment's queries put in the buffer. So running the segments' backwards in reverse order gives the
gradient of one pass over the whole sequence (``t1_actors.train.segments`` is that driver).

Memory: the K/V of the earlier positions and their gradients (layers x 2 x tokens x kv_dim, twice) and
one segment's activations. Only ``MoEBackbone``'s attention knows this cache; a model whose layers call
``update`` (Qwen3.5's hybrid cache) is refused by name.
"""

from __future__ import annotations

import torch

from t1_actors.policy.kv_cache import KVCache

_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_flash_cpu_backward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(softmax(q k^T / sqrt(d)) v, logsumexp of each query's scores)``; ``causal``: square, top-left.

    q ``[B, H, T, D]``, k/v ``[B, Hkv, S, D]`` with ``H`` a multiple of ``Hkv`` (grouped queries). On CPU the
    aten flash kernel (no score matrix kept); elsewhere ``math_attention_with_lse``.
    """
    if q.device.type == "cpu" and _flash_cpu is not None:
        out, lse = _flash_cpu(q, k, v, 0.0, causal)
        return out, lse
    return math_attention_with_lse(q, k, v, causal)


def attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of one block of keys, given the output and log-sum-exp over *all* keys."""
    if q.device.type == "cpu" and _flash_cpu_backward is not None:
        return _flash_cpu_backward(grad_out.contiguous(), q, k, v, out, lse, 0.0, causal)
    return math_attention_backward(grad_out, q, k, v, out, lse, causal)


def math_attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention_with_lse`` with the ``[T, S]`` scores of one layer materialised (any device)."""
    scores = _grouped_scores(q, k, causal)
    lse = torch.logsumexp(scores, dim=-1)
    out = _ungroup(torch.exp(scores - lse.unsqueeze(-1)).to(v.dtype) @ v.unsqueeze(2))
    return out, _ungroup(lse)


def math_attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            out: torch.Tensor, lse: torch.Tensor, causal: bool
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The flash backward of one key block, written out:

        P = exp(q k^T / sqrt(d) - lse),  dV = P^T dO,  dS = P * (dO V^T - rowsum(dO * O)),
        dQ = dS K / sqrt(d),  dK = dS^T Q / sqrt(d)
    """
    scale = q.shape[-1] ** -0.5
    kv_heads = k.shape[1]
    probs = torch.exp(_grouped_scores(q, k, causal) - _group(lse, kv_heads).unsqueeze(-1)).to(q.dtype)
    d_out = _group(grad_out, kv_heads)
    dv = (probs.transpose(-1, -2) @ d_out).sum(2)
    d_probs = d_out @ v.unsqueeze(2).transpose(-1, -2)
    row = (d_out * _group(out, kv_heads)).sum(-1, keepdim=True)
    d_scores = probs * (d_probs - row)
    dq = _ungroup(d_scores @ k.unsqueeze(2)) * scale
    dk = (d_scores.transpose(-1, -2) @ _group(q, kv_heads)).sum(2) * scale
    return dq, dk, dv


def _group(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, H, ...] -> [B, Hkv, H / Hkv, ...]``: the query heads that share one K/V head side by side."""
    return x.reshape(x.shape[0], kv_heads, x.shape[1] // kv_heads, *x.shape[2:])


def _ungroup(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _grouped_scores(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    scores = _group(q, k.shape[1]) @ k.unsqueeze(2).transpose(-1, -2)
    scores = scores.to(torch.promote_types(q.dtype, torch.float32)) * q.shape[-1] ** -0.5
    if causal:
        steps = q.shape[2]
        scores = scores.masked_fill(torch.ones(steps, steps, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return scores


def merge(first: tuple[torch.Tensor, torch.Tensor], second: tuple[torch.Tensor, torch.Tensor]
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the union of two key blocks from each block's ``(out, lse)``."""
    (out1, lse1), (out2, lse2) = first, second
    lse = torch.logaddexp(lse1, lse2)
    weight1 = torch.exp(lse1 - lse).unsqueeze(-1).to(out1.dtype)
    weight2 = torch.exp(lse2 - lse).unsqueeze(-1).to(out2.dtype)
    return out1 * weight1 + out2 * weight2, lse


class _PrefixAttention(torch.autograd.Function):
    """Causal attention of one segment over the cached prefix and itself; gradients of the prefix's K/V go
    to the cache's gradient buffers, and the segment's own K/V receive what later segments put there."""

    @staticmethod
    def forward(ctx, q, k, v, cache: SegmentKV, layer: int):
        start, end = cache.length, cache.length + k.shape[2]
        keys, values = cache.keys[layer], cache.values[layer]
        keys[:, :, start:end] = k.detach()
        values[:, :, start:end] = v.detach()
        out, lse = attention_with_lse(q, k, v, causal=True)
        if start > 0:
            out, lse = merge(attention_with_lse(q, keys[:, :, :start], values[:, :, :start], causal=False), (out, lse))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cache, ctx.layer, ctx.start = cache, layer, start
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        cache, layer, start = ctx.cache, ctx.layer, ctx.start
        end = start + k.shape[2]
        dq, dk, dv = attention_backward(grad_out, q, k, v, out, lse, causal=True)
        grad_keys, grad_values = cache.gradient_buffers(layer)
        if start > 0:
            dq_prefix, dk_prefix, dv_prefix = attention_backward(
                grad_out, q, cache.keys[layer][:, :, :start], cache.values[layer][:, :, :start], out, lse, causal=False)
            dq = dq + dq_prefix
            grad_keys[:, :, :start] += dk_prefix
            grad_values[:, :, :start] += dv_prefix
        return dq, dk + grad_keys[:, :, start:end], dv + grad_values[:, :, start:end], None, None


class SegmentKV(KVCache):
    """K/V (and, once a backward needs them, their gradients) of ``width`` positions of ``rows`` rows.

    The driver sets ``length`` to a segment's first position before its forward; the backbone's
    ``advance`` moves it past the segment. Positions at or after a segment are never read by it.
    """

    def __init__(self, num_layers: int, rows: int, kv_heads: int, head_dim: int, width: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        super().__init__(num_layers, rows, kv_heads, head_dim, capacity=width, dtype=dtype, device=device)
        self.grad_keys: list[torch.Tensor] | None = None
        self.grad_values: list[torch.Tensor] | None = None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of the segment ``[length, length + k.shape[2])``: ``q [B,H,T,D]``, ``k/v [B,Hkv,T,D]``."""
        if self.length + k.shape[2] > self.capacity:
            raise ValueError(f"segment [{self.length}, {self.length + k.shape[2]}) runs past the cache's "
                             f"{self.capacity} positions")
        return _PrefixAttention.apply(q, k, v, self, layer)

    def gradient_buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """dL/dK and dL/dV of ``layer``, accumulated over the segments whose backward ran (zeros at first)."""
        if self.grad_keys is None:
            self.grad_keys = [torch.zeros_like(k) for k in self.keys]
            self.grad_values = [torch.zeros_like(v) for v in self.values]
        return self.grad_keys[layer], self.grad_values[layer]

    @property
    def nbytes(self) -> int:
        """Bytes of the K/V buffers and, once allocated, their gradients."""
        tensors = self.keys + self.values + (self.grad_keys or []) + (self.grad_values or [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def update(self, layer, key, value):
        raise TypeError("this model's attention calls KVCache.update, which a SegmentKV does not serve: only "
                        "MoEBackbone's attention runs in segments; set [learner]/[critic] max_tokens_per_microbatch "
                        "above the longest chunk for this model")
