"""Multi-turn GRPO on a KernelBench checkout with the paper's split: 90 + 90 training tasks, 10 + 10 held out.

Run (from the repository root; DIR is a checkout's `KernelBench/` folder holding level1/ and level2/):
  python -m kevin_jax.main --config=configs/kernelbench.py --config.tasks.source=DIR --workdir=runs/kb
  python -m kevin_jax.main --config=configs/kernelbench.py --config.tasks.source=DIR --workdir=runs/kb_hf \\
      --config.policy.checkpoint=HF_DIR        # a local Hugging Face checkpoint instead: no warm start
  python -m kevin_jax.kernels.check_tasks --source DIR --levels 1,2      # list and validate the tasks first
  python -m kevin_jax.main --config=configs/eval.py:kernelbench --config.tasks.source=DIR \\
      --config.evaluation.checkpoint=runs/kb/hf --workdir=runs/kb_eval  # the standard report (configs/eval.py)
The embedded policy (no policy.checkpoint) warm starts on the corpora of the bundled suite and the generated task
world (sft.corpus_sources; KernelBench has no solutions to learn from), then runs RL on the training split. The
prompt budget follows the tasks (rollout.context_from_tasks): the longest first-turn prompt, measured with the
policy's tokenizer, sets rollout.max_context_tokens; a task that cannot fit the model's context is named.
Presets (after a colon, comma-separated; multiturn.py's presets apply too):
  runlocal  multiturn.py's smoke run (tiny policy, 2 tasks, 2 x 2 turns) with a small generated world for the
            warm start's corpus: a 2-core CPU with --config.evaluator.backend=scripted, under 4 GB.
  paper     the 32B recipe (multiturn.py), with this file's task settings.
  v0        file names of KernelBench v0 (before July 2025), where level1/97 is 97_CosineSimilarityLoss.

The paper trains on 180 KernelBench tasks (90 from level 1, 90 from level 2) and holds out the remaining 20
[P §1 "Dataset (train)"], without saying which. Held-out choice here, deterministic and independent of any RNG
implementation: in each level, the 10 task ids with the smallest sha256("kevin_jax-heldout:" + id) hex digest
(`heldout()`, checked by tests/test_kernelbench_split.py). Task ids are the file stems of KernelBench's main
branch (v0.1 and later; read from the repository listing); _OLD files and levels 3+ are never selected.
"""

import hashlib

import ml_collections

from configs import multiturn

HELDOUT_PER_LEVEL = 10  # Held-out tasks per level [P §1: 100 - 90].
HELDOUT_SALT = "kevin_jax-heldout:"

LEVEL1 = (
    "1_Square_matrix_multiplication_",
    "2_Standard_matrix_multiplication_",
    "3_Batched_matrix_multiplication",
    "4_Matrix_vector_multiplication_",
    "5_Matrix_scalar_multiplication",
    "6_Matmul_with_large_K_dimension_",
    "7_Matmul_with_small_K_dimension_",
    "8_Matmul_with_irregular_shapes_",
    "9_Tall_skinny_matrix_multiplication_",
    "10_3D_tensor_matrix_multiplication",
    "11_4D_tensor_matrix_multiplication",
    "12_Matmul_with_diagonal_matrices_",
    "13_Matmul_for_symmetric_matrices",
    "14_Matmul_for_upper_triangular_matrices",
    "15_Matmul_for_lower_triangular_matrices",
    "16_Matmul_with_transposed_A",
    "17_Matmul_with_transposed_B",
    "18_Matmul_with_transposed_both",
    "19_ReLU",
    "20_LeakyReLU",
    "21_Sigmoid",
    "22_Tanh",
    "23_Softmax",
    "24_LogSoftmax",
    "25_Swish",
    "26_GELU_",
    "27_SELU_",
    "28_HardSigmoid",
    "29_Softplus",
    "30_Softsign",
    "31_ELU",
    "32_HardTanh",
    "33_BatchNorm",
    "34_InstanceNorm",
    "35_GroupNorm_",
    "36_RMSNorm_",
    "37_FrobeniusNorm_",
    "38_L1Norm_",
    "39_L2Norm_",
    "40_LayerNorm",
    "41_Max_Pooling_1D",
    "42_Max_Pooling_2D",
    "43_Max_Pooling_3D",
    "44_Average_Pooling_1D",
    "45_Average_Pooling_2D",
    "46_Average_Pooling_3D",
    "47_Sum_reduction_over_a_dimension",
    "48_Mean_reduction_over_a_dimension",
    "49_Max_reduction_over_a_dimension",
    "50_conv_standard_2D__square_input__square_kernel",
    "51_Argmax_over_a_dimension",
    "52_Argmin_over_a_dimension",
    "53_Min_reduction_over_a_dimension",
    "54_conv_standard_3D__square_input__square_kernel",
    "55_conv_standard_2D__asymmetric_input__square_kernel",
    "56_conv_standard_2D__asymmetric_input__asymmetric_kernel",
    "57_conv_transposed_2D__square_input__square_kernel",
    "58_conv_transposed_3D__asymmetric_input__asymmetric_kernel",
    "59_conv_standard_3D__asymmetric_input__square_kernel",
    "60_conv_standard_3D__square_input__asymmetric_kernel",
    "61_conv_transposed_3D__square_input__square_kernel",
    "62_conv_standard_2D__square_input__asymmetric_kernel",
    "63_conv_standard_2D__square_input__square_kernel",
    "64_conv_transposed_1D",
    "65_conv_transposed_2D__square_input__asymmetric_kernel",
    "66_conv_standard_3D__asymmetric_input__asymmetric_kernel",
    "67_conv_standard_1D",
    "68_conv_transposed_3D__square_input__asymmetric_kernel",
    "69_conv_transposed_2D__asymmetric_input__asymmetric_kernel",
    "70_conv_transposed_3D__asymmetric_input__square_kernel",
    "71_conv_transposed_2D__asymmetric_input__square_kernel",
    "72_conv_transposed_3D_asymmetric_input_asymmetric_kernel___strided_padded_grouped_",
    "73_conv_transposed_3D_asymmetric_input_square_kernel__strided_padded__grouped",
    "74_conv_transposed_1D_dilated",
    "75_conv_transposed_2D_asymmetric_input_asymmetric_kernel_strided__grouped____padded____dilated__",
    "76_conv_standard_1D_dilated_strided__",
    "77_conv_transposed_3D_square_input_square_kernel___padded____dilated____strided__",
    "78_conv_transposed_2D_asymmetric_input_asymmetric_kernel___padded__",
    "79_conv_transposed_1D_asymmetric_input_square_kernel___padded____strided____dilated__",
    "80_conv_standard_2D_square_input_asymmetric_kernel___dilated____padded__",
    "81_conv_transposed_2D_asymmetric_input_square_kernel___dilated____padded____strided__",
    "82_conv_depthwise_2D_square_input_square_kernel",
    "83_conv_depthwise_2D_square_input_asymmetric_kernel",
    "84_conv_depthwise_2D_asymmetric_input_square_kernel",
    "85_conv_depthwise_2D_asymmetric_input_asymmetric_kernel",
    "86_conv_depthwise_separable_2D",
    "87_conv_pointwise_2D",
    "88_MinGPTNewGelu",
    "89_cumsum",
    "90_cumprod",
    "91_cumsum_reverse",
    "92_cumsum_exclusive",
    "93_masked_cumsum",
    "94_MSELoss",
    "95_CrossEntropyLoss",
    "96_HuberLoss",
    "97_ScaledDotProductAttention",
    "98_KLDivLoss",
    "99_TripletMarginLoss",
    "100_HingeLoss",
)

LEVEL2 = (
    "1_Conv2D_ReLU_BiasAdd",
    "2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide",
    "3_ConvTranspose3d_Sum_LayerNorm_AvgPool_GELU",
    "4_Conv2d_Mish_Mish",
    "5_ConvTranspose2d_Subtract_Tanh",
    "6_Conv3d_Softmax_MaxPool_MaxPool",
    "7_Conv3d_ReLU_LeakyReLU_GELU_Sigmoid_BiasAdd",
    "8_Conv3d_Divide_Max_GlobalAvgPool_BiasAdd_Sum",
    "9_Matmul_Subtract_Multiply_ReLU",
    "10_ConvTranspose2d_MaxPool_Hardtanh_Mean_Tanh",
    "11_ConvTranspose2d_BatchNorm_Tanh_MaxPool_GroupNorm",
    "12_Gemm_Multiply_LeakyReLU",
    "13_ConvTranspose3d_Mean_Add_Softmax_Tanh_Scaling",
    "14_Gemm_Divide_Sum_Scaling",
    "15_ConvTranspose3d_BatchNorm_Subtract",
    "16_ConvTranspose2d_Mish_Add_Hardtanh_Scaling",
    "17_Conv2d_InstanceNorm_Divide",
    "18_Matmul_Sum_Max_AvgPool_LogSumExp_LogSumExp",
    "19_ConvTranspose2d_GELU_GroupNorm",
    "20_ConvTranspose3d_Sum_ResidualAdd_Multiply_ResidualAdd",
    "21_Conv2d_Add_Scale_Sigmoid_GroupNorm",
    "22_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish",
    "23_Conv3d_GroupNorm_Mean",
    "24_Conv3d_Min_Softmax",
    "25_Conv2d_Min_Tanh_Tanh",
    "26_ConvTranspose3d_Add_HardSwish",
    "27_Conv3d_HardSwish_GroupNorm_Mean",
    "28_BMM_InstanceNorm_Sum_ResidualAdd_Multiply",
    "29_Matmul_Mish_Mish",
    "30_Gemm_GroupNorm_Hardtanh",
    "31_Conv2d_Min_Add_Multiply",
    "32_Conv2d_Scaling_Min",
    "33_Gemm_Scale_BatchNorm",
    "34_ConvTranspose3d_LayerNorm_GELU_Scaling",
    "35_Conv2d_Subtract_HardSwish_MaxPool_Mish",
    "36_ConvTranspose2d_Min_Sum_GELU_Add",
    "37_Matmul_Swish_Sum_GroupNorm",
    "38_ConvTranspose3d_AvgPool_Clamp_Softmax_Multiply",
    "39_Gemm_Scale_BatchNorm",
    "40_Matmul_Scaling_ResidualAdd",
    "41_Gemm_BatchNorm_GELU_ReLU",
    "42_ConvTranspose2d_GlobalAvgPool_BiasAdd_LogSumExp_Sum_Multiply",
    "43_Conv3d_Max_LogSumExp_ReLU",
    "44_ConvTranspose2d_Multiply_GlobalAvgPool_GlobalAvgPool_Mean",
    "45_Gemm_Sigmoid_LogSumExp",
    "46_Conv2d_Subtract_Tanh_Subtract_AvgPool",
    "47_Conv3d_Mish_Tanh",
    "48_Conv3d_Scaling_Tanh_Multiply_Sigmoid",
    "49_ConvTranspose3d_Softmax_Sigmoid",
    "50_ConvTranspose3d_Scaling_AvgPool_BiasAdd_Scaling",
    "51_Gemm_Subtract_GlobalAvgPool_LogSumExp_GELU_ResidualAdd",
    "52_Conv2d_Activation_BatchNorm",
    "53_Gemm_Scaling_Hardtanh_GELU",
    "54_Conv2d_Multiply_LeakyReLU_GELU",
    "55_Matmul_MaxPool_Sum_Scale",
    "56_Matmul_Sigmoid_Sum",
    "57_Conv2d_ReLU_HardSwish",
    "58_ConvTranspose3d_LogSumExp_HardSwish_Subtract_Clamp",
    "59_Matmul_Swish_Scaling",
    "60_ConvTranspose3d_Swish_GroupNorm_HardSwish",
    "61_ConvTranspose3d_ReLU_GroupNorm",
    "62_Matmul_GroupNorm_LeakyReLU_Sum",
    "63_Gemm_ReLU_Divide",
    "64_Gemm_LogSumExp_LeakyReLU_LeakyReLU_GELU_GELU",
    "65_Conv2d_AvgPool_Sigmoid_Sum",
    "66_Matmul_Dropout_Softmax",
    "67_Conv2d_GELU_GlobalAvgPool",
    "68_Matmul_Min_Subtract",
    "69_Conv2d_HardSwish_ReLU",
    "70_Gemm_Sigmoid_Scaling_ResidualAdd",
    "71_Conv2d_Divide_LeakyReLU",
    "72_ConvTranspose3d_BatchNorm_AvgPool_AvgPool",
    "73_Conv2d_BatchNorm_Scaling",
    "74_ConvTranspose3d_LeakyReLU_Multiply_LeakyReLU_Max",
    "75_Gemm_GroupNorm_Min_BiasAdd",
    "76_Gemm_Add_ReLU",
    "77_ConvTranspose3d_Scale_BatchNorm_GlobalAvgPool",
    "78_ConvTranspose3d_Max_Max_Sum",
    "79_Conv3d_Multiply_InstanceNorm_Clamp_Multiply_Max",
    "80_Gemm_Max_Subtract_GELU",
    "81_Gemm_Swish_Divide_Clamp_Tanh_Clamp",
    "82_Conv2d_Tanh_Scaling_BiasAdd_Max",
    "83_Conv3d_GroupNorm_Min_Clamp_Dropout",
    "84_Gemm_BatchNorm_Scaling_Softmax",
    "85_Conv2d_GroupNorm_Scale_MaxPool_Clamp",
    "86_Matmul_Divide_GELU",
    "87_Conv2d_Subtract_Subtract_Mish",
    "88_Gemm_GroupNorm_Swish_Multiply_Swish",
    "89_ConvTranspose3d_MaxPool_Softmax_Subtract_Swish_Max",
    "90_Conv3d_LeakyReLU_Sum_Clamp_GELU",
    "91_ConvTranspose2d_Softmax_BiasAdd_Scaling_Sigmoid",
    "92_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp",
    "93_ConvTranspose2d_Add_Min_GELU_Multiply",
    "94_Gemm_BiasAdd_Hardtanh_Mish_GroupNorm",
    "95_Matmul_Add_Swish_Tanh_GELU_Hardtanh",
    "96_ConvTranspose3d_Multiply_Max_GlobalAvgPool_Clamp",
    "97_Matmul_BatchNorm_BiasAdd_Divide_Swish",
    "98_Matmul_AvgPool_GELU_Scale_Max",
    "99_Matmul_GELU_Softmax",
    "100_ConvTranspose3d_Clamp_Min_Divide",
)

def _num(name: str) -> int:
  return int(name.split("_", 1)[0])


def level_ids(level: int, names=None) -> list[str]:
  """Task ids ('level1/19_ReLU') of a level, in task-number order."""
  names = names if names is not None else {1: LEVEL1, 2: LEVEL2}[level]
  return [f"level{level}/{n}" for n in sorted(names, key=_num)]


def heldout(ids, n: int = HELDOUT_PER_LEVEL) -> list[str]:
  """The n ids with the smallest sha256(HELDOUT_SALT + id), in task-number order."""
  chosen = sorted(ids, key=lambda i: hashlib.sha256((HELDOUT_SALT + i).encode()).hexdigest())[:n]
  return sorted(chosen, key=lambda i: _num(i.split("/", 1)[1]))


TEST_IDS = tuple(heldout(level_ids(1)) + heldout(level_ids(2)))
TRAIN_IDS = tuple(i for lvl in (1, 2) for i in level_ids(lvl) if i not in set(TEST_IDS))
V0_RENAMES = {"level1/97_ScaledDotProductAttention": "level1/97_CosineSimilarityLoss"}  # main -> v0 file names.


def split_ids(v0: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(train ids, test ids) of the paper split, with v0 file names if asked."""
  rename = (lambda i: V0_RENAMES.get(i, i)) if v0 else (lambda i: i)
  return tuple(map(rename, TRAIN_IDS)), tuple(map(rename, TEST_IDS))


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  names = [a for a in arg.split(",") if a]
  c = multiturn.get_config(",".join(n for n in names if n != "v0"))
  train, test = split_ids(v0="v0" in names)
  c.tasks.source = ""  # A checkout's KernelBench/ folder: required (--config.tasks.source=DIR).
  c.tasks.layout = "kernelbench"  # Checked at start: DIR/level1/, DIR/level2/ hold task files.
  c.tasks.levels = (1, 2)  # KernelBench levels 1 and 2 [P §1].
  c.tasks.train_ids = train  # 90 level-1 + 90 level-2 task ids [P §1].
  c.tasks.test_ids = test  # The 10 + 10 held out (sha256 rule above).
  c.rollout.context_from_tasks = True  # KernelBench prompts reach ~2.2k tokens with the bundled tokenizer.
  c.sft.corpus_sources = ("bundled", "generated")  # KernelBench has no solutions: warm start on ours.
  c.sft.steps = 2000  # A fixed count, not 30 epochs: the world's 800 training tasks dwarf the suite's 43. About
  #   twice the default job's warm start (~1,100 steps on the bundled corpus).
  c.evaluation.in_training_splits = ("test",)  # The 20 held-out tasks.
  c.evaluation.standard_report = True  # The closing evaluation's standard report in workdir/report.
  if "runlocal" in names:  # Warm start (1 step), 1 RL step, the closing evaluation and report: < 90 s on 2 cores.
    c.tasks.world_train = 4  # A small world: its corpus is built in seconds.
    c.tasks.world_heldout_compositions = 1
    c.tasks.world_heldout_styles = 1
    c.total_steps = 1
    c.sft.steps = 1
    c.sft.eval_every_steps = 0  # No held-out loss or samples in the warm start.
    c.rollout.max_context_tokens = 0  # The prompt budget is the longest task prompt, rounded up (no floor).
    c.evaluation.in_training_first = False  # Only the closing evaluation.
  return c
