"""The front of the MLP in a decode step, silu(x @ W_gate) * (x @ W_up), as one Pallas kernel.

In a decode step (one token per row) XLA runs the gate/up GEMM and the SwiGLU as two kernels: the GEMM writes
[B, 2F] to memory and the SwiGLU kernel reads it back. Here program (i, j) owns rows [i*block_m, (i+1)*block_m)
and columns [j*block_n, (j+1)*block_n) of both weight matrices: it loops over D in `block_d` slices, keeps the two
fp32 accumulators in registers, and writes silu(gate) * up once, in the input's dtype. The weights stay in their
[D, F] layout (no per-step transpose or concatenation). Rows are padded up to a power of two >= 16 (Triton's
matmul tiles); D and F must be multiples of 16 (`supported`). x comes normed (XLA's post-attention RMSNorm), or raw
with the norm's scale folded into the weights and each row's 1/rms given (`inv_rms_B`) or computed here
(`rms_eps`): DecodeConfig.norm. Multiplying the x slices by the scale inside the kernel doubled its time
(decode_tiles.dot_pair).

Numbers: fp32 accumulation; the SwiGLU is computed in fp32 and rounded once (XLA's path rounds gate and up to the
compute dtype first), so bf16 results differ from the XLA path by bf16 rounding. tests/test_policy_decode_mlp.py
compares with the jnp expression in interpret mode on the CPU (fp32, exact dots) and on the GPU (bf16).

DecodeConfig.mlp='auto' uses the kernel on a GPU up to AUTO_MAX_ROWS rows (+4.5 % decode tokens/s at the
0.5B shape, B = 64; experiments/sampler_kernels).

`down_proj`, the MLP's down projection split along F: DecodeConfig.down='auto' (the default) uses it on a GPU
up to AUTO_MAX_ROWS rows where D <= AUTO_DOWN_MAX_D (+5.1 % decode tokens/s at the 0.5B shape, B = 64;
experiments/sampler_kernels). tests/test_policy_gpu.py runs the GPU sampler tests with it too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from kevin_jax.policy.decode import tiles as decode_tiles
from kevin_jax.policy.decode.tiles import pick_block

Array = jax.Array
BLOCK_N = 64  # Columns per program at most: F = 4,864 (0.5B) gives 76 programs; faster than 32 columns (152
               # programs) alone and end to end, and than 132 programs of 32-48 columns.
BLOCK_D = 128  # D per loop iteration at most.
# Both shrink by halves, down to 16 (Triton's matmul tiles), to the largest power of two dividing D or F.
BLOCK_M = 64  # Rows per program at most (larger batches get more programs along the rows).
FRONT_STAGES = 4  # Pipeline stages of the front on compute capability >= 9.0 where their buffers fit (front_stages:
                  # 3 x 48 KB of bf16 x and weight slices at 64 x 128 do; fp32's 288 KB do not), else 3. 4 against
                  # 3: +0.6 % decode tokens/s at the 0.5B shape, B = 64 (experiments/sampler_kernels).
SM90_SHARED_MEMORY = 232448  # bytes of shared memory a block may use on an H100 / H200 (Triton's "available" figure)
AUTO_MAX_ROWS = 64  # DecodeConfig.mlp='auto' uses the kernel up to this batch: faster at 64 rows; at 256 each
                    # 64-row block re-reads the weights and the kernel is slower than XLA's (BENCHMARKS.md Sampler).


def supported(hidden: int, intermediate: int) -> bool:
  """Whether the kernel takes D = hidden and F = intermediate: both multiples of 16."""
  return pick_block(hidden, BLOCK_D) > 0 and pick_block(intermediate, BLOCK_N) > 0


def _kernel(x_ref, *refs, block_d: int, scaled: bool, rms_eps: float | None):
  """refs: [1/rms if scaled], w_gate, w_up, out. rms_eps: the kernel computes 1/rms itself."""
  refs = list(refs)
  r_ref = refs.pop(0) if scaled else None
  wg_ref, wu_ref, o_ref = refs
  g, u = decode_tiles.dot_pair(x_ref, lambda ks: wg_ref[ks, :], lambda ks: wu_ref[ks, :], wg_ref.shape[1], block_d,
                               r_ref, rms_eps)
  o_ref[...] = (g * jax.nn.sigmoid(g) * u).astype(o_ref.dtype)


def front_stages(block_m: int, block_d: int, block_n: int, itemsize: int) -> int:
  """swiglu_front's default pipeline stages on this process' first device: FRONT_STAGES where their buffers fit a
  block's shared memory (compute capability >= 9.0: SM90_SHARED_MEMORY), else 3. Triton keeps stages - 1 buffers
  of the x slice and both weight slices."""
  hopper = decode_tiles.compute_capability() >= 9.0
  need = (FRONT_STAGES - 1) * (block_m * block_d + 2 * block_d * block_n) * itemsize
  return FRONT_STAGES if hopper and need <= SM90_SHARED_MEMORY else 3


@functools.partial(jax.jit, static_argnames=("rms_eps", "block_n", "block_d", "block_m", "num_warps", "num_stages",
                                             "interpret"))
def swiglu_front(x_BxD: Array, w_gate_DxF: Array, w_up_DxF: Array, inv_rms_B: Array | None = None, *,
                 rms_eps: float | None = None, block_n: int = BLOCK_N, block_d: int = BLOCK_D,
                 block_m: int = BLOCK_M, num_warps: int = 4, num_stages: int | None = None,
                 interpret: bool = False) -> Array:
  """silu(x @ w_gate) * (x @ w_up): [B, D] x [D, F] -> [B, F] in x's dtype (fp32 accumulation).

  With inv_rms_B (fp32 [B]) or rms_eps, x is the raw residual and the weights hold the RMSNorm's scale
  (step.fold): each row's products are multiplied by inv_rms_B, or by 1/rms = rsqrt(mean(x^2) + rms_eps)
  computed in the kernel (decode_tiles.dot_pair's sums of squares), before the SwiGLU. num_stages None:
  front_stages()."""
  b, d = x_BxD.shape
  f = w_gate_DxF.shape[1]
  if w_gate_DxF.shape != (d, f) or w_up_DxF.shape != (d, f):
    raise ValueError(f"weights must both be [D={d}, F], got {w_gate_DxF.shape} and {w_up_DxF.shape}")
  block_d, block_n = pick_block(d, block_d), pick_block(f, block_n)
  if not (block_d and block_n):
    raise ValueError(f"swiglu_front needs D ({d}) and F ({f}) multiples of 16")
  scaled = decode_tiles.check_norm_args(b, inv_rms_B, rms_eps)
  mp, bm = decode_tiles.row_tiles(b, block_m)
  x = decode_tiles.pad_rows(x_BxD.astype(w_gate_DxF.dtype), mp)
  r = [decode_tiles.pad_rows(inv_rms_B.astype(jnp.float32), mp)] if scaled else []
  if num_stages is None:
    num_stages = front_stages(bm, block_d, block_n, w_gate_DxF.dtype.itemsize)
  out = pl.pallas_call(
      functools.partial(_kernel, block_d=block_d, scaled=scaled, rms_eps=rms_eps),
      grid=(mp // bm, f // block_n),
      in_specs=[
          pl.BlockSpec((bm, d), lambda i, j: (i, 0)),
          *[pl.BlockSpec((bm,), lambda i, j: (i,))] * scaled,
          pl.BlockSpec((d, block_n), lambda i, j: (0, j)),
          pl.BlockSpec((d, block_n), lambda i, j: (0, j)),
      ],
      out_specs=pl.BlockSpec((bm, block_n), lambda i, j: (i, j)),
      out_shape=jax.ShapeDtypeStruct((mp, f), x_BxD.dtype),
      compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="kevin_decode_swiglu",
  )(x, *r, w_gate_DxF, w_up_DxF)
  return out[:b]


# --- The down projection, h @ W_down ([B, F] x [F, D]), split along F (DecodeConfig.down). ---
# At 64 rows its output is only [64, D] (D = 896 at 0.5B): with whole-F columns per program there are D / block_n
# programs, far fewer than the GPU's 132 SMs, and XLA's GEMM reads W_down well below the copy bandwidth. Here
# program (i, j, s) sums F slice s of the product into an fp32 partial [block_m, block_n]; XLA then adds the
# `splits` partials (a small reduction that it fuses with the residual add after the MLP). Summing them in this
# kernel instead, by each output block's last split to finish, is slower (BENCHMARKS.md Sampler).
AUTO_DOWN_MAX_D = 1024  # DecodeConfig.down='auto' uses down_proj up to AUTO_MAX_ROWS rows where D is at most
                        # this: at 64 rows it beats XLA's einsum at D = 896 (0.5B), not at D = 1,536 (1.5B;
                        # BENCHMARKS.md Sampler).


DOWN_SPLITS = 4  # F splits by default, where they cut F into block_k multiples (else pick_splits), with DOWN_STAGES
DOWN_STAGES = 5  # pipeline stages: at the 0.5B shape, B = 64, pick_splits' 19 splits leave XLA 4.4 MB of fp32
                 # partials to sum, 4 leave 0.9 MB; with decode_qkv's NUM_STAGES, +2.4 % decode tokens/s there
                 # (experiments/sampler_kernels). Not measured at other shapes.


def resolve_splits(splits: int | None, f: int, n_blocks: int, block_k: int, sm_count: int | None = None) -> int:
  """down_proj's split count: None -> DOWN_SPLITS where it divides F's block_k chunks, else pick_splits for
  sm_count SMs (default: this process' first device's); 0 -> that pick_splits; any other value as given."""
  if splits is None:
    splits = DOWN_SPLITS if (f // block_k) % DOWN_SPLITS == 0 else 0
  return splits or pick_splits(f, n_blocks, block_k, sm_count or decode_tiles.sm_count())


def pick_splits(f: int, n_blocks: int, block_k: int, min_programs: int) -> int:
  """The fewest F splits, each a multiple of block_k, giving n_blocks * splits >= min_programs (else the most)."""
  chunks = f // block_k
  divisors = [s for s in range(1, chunks + 1) if chunks % s == 0]
  return next((s for s in divisors if n_blocks * s >= min_programs), divisors[-1])


def _down_kernel(h_ref, w_ref, o_ref, *, block_k: int):
  o_ref[...] = decode_tiles.dot_loop(h_ref, w_ref, block_k)


@functools.partial(jax.jit, static_argnames=("splits", "block_n", "block_k", "block_m", "num_warps", "num_stages",
                                             "interpret"))
def down_proj(h_BxF: Array, w_down_FxD: Array, *, splits: int | None = None, block_n: int = 64, block_k: int = 64,
              block_m: int = BLOCK_M, num_warps: int = 4, num_stages: int = DOWN_STAGES,
              interpret: bool = False) -> Array:
  """h @ w_down: [B, F] x [F, D] -> [B, D] in h's dtype, F split `splits` ways (resolve_splits) into fp32 partials
  summed by XLA. F must be a multiple of block_k and D of 16 (block_n halves down to a divisor of D)."""
  partials = down_partials(h_BxF, w_down_FxD, splits=splits, block_n=block_n, block_k=block_k, block_m=block_m,
                           num_warps=num_warps, num_stages=num_stages, interpret=interpret)
  return partials.sum(0)[:h_BxF.shape[0]].astype(h_BxF.dtype)


@functools.partial(jax.jit, static_argnames=("splits", "block_n", "block_k", "block_m", "num_warps", "num_stages",
                                             "interpret"))
def down_partials(h_BxF: Array, w_down_FxD: Array, *, splits: int | None = None, block_n: int = 64,
                  block_k: int = 64, block_m: int = BLOCK_M, num_warps: int = 4, num_stages: int = DOWN_STAGES,
                  interpret: bool = False) -> Array:
  """down_proj's fp32 partials before XLA's sum: [splits, R, D], R >= B the rows padded to the kernel's row tiles
  (rows past B hold zeros' products)."""
  b, f = h_BxF.shape
  d = w_down_FxD.shape[1]
  if w_down_FxD.shape[0] != f:
    raise ValueError(f"w_down must be [F={f}, D], got {w_down_FxD.shape}")
  block_n, block_k = pick_block(d, block_n), pick_block(f, block_k)
  if not (block_n and block_k):
    raise ValueError(f"down_proj needs F ({f}) and D ({d}) multiples of 16")
  splits = resolve_splits(splits, f, d // block_n, block_k)
  if f % (splits * block_k):
    raise ValueError(f"splits={splits} must divide F={f} into multiples of block_k={block_k}")
  ks = f // splits
  mp, bm = decode_tiles.row_tiles(b, block_m)
  h = decode_tiles.pad_rows(h_BxF.astype(w_down_FxD.dtype), mp)
  return pl.pallas_call(
      functools.partial(_down_kernel, block_k=block_k),
      grid=(mp // bm, d // block_n, splits),
      in_specs=[
          pl.BlockSpec((bm, ks), lambda i, j, s: (i, s)),
          pl.BlockSpec((ks, block_n), lambda i, j, s: (s, j)),
      ],
      out_specs=pl.BlockSpec((None, bm, block_n), lambda i, j, s: (s, i, j)),
      out_shape=jax.ShapeDtypeStruct((splits, mp, d), jnp.float32),
      compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="kevin_decode_down",
  )(h, w_down_FxD)
