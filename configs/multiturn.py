"""Multi-turn GRPO (Kevin, arXiv 2507.11948): the main job.

Run (from the repository root, one GPU):
  python -m kevin_jax.main --config=configs/multiturn.py --workdir=runs/multiturn

Presets, comma-separated after a colon (big_vision style):
  configs/multiturn.py:runlocal   tiny policy, 2 tasks, 2 trajectories x 2 turns, a 2-step warm start: a smoke
                                  run; on a CPU with --config.evaluator.backend=scripted, 1-2 minutes and < 4 GB.
  configs/multiturn.py:paper      the paper's recipe: a local QwQ-32B-class HF checkpoint
                                  (--config.policy.checkpoint=DIR), KernelBench L1+L2
                                  (--config.tasks.source=DIR), 8 GPUs, 16k/22k-token responses.
  configs/multiturn.py:world      the generated task world (tasks.source='generated'): a 1,500-step warm start on
                                  its corpus, RL on its train split, in-job evaluations before and after on its four
                                  splits (train, heldout_compositions, heldout_styles, suite), the whole job within
                                  time_budget_s = 900 s. The main job of the task-world experiments
                                  (experiments/world_job: `python experiments/sweep.py world`); with runlocal, a
                                  small world, 1 warm-start step, 1 RL step, one task per split.
Any field can be overridden: --config.rl.gamma=0.8. A misspelt field is an error (the config is locked).

Paper values cite the Kevin paper (arXiv 2507.11948) by section: [P §n], [P Table n], [P eq. n].
"""

import ml_collections

# Every field is declared here; other configs (singleturn, eval, sft) start from this one.


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.mode = "train"  # Which job main.py runs: train | evaluate | sft.
  c.seed = 0  # Root PRNG seed: parameters, sampling, task order.
  c.init_from = ""  # Start from other weights: an Orbax workdir or an HF directory ('' = policy.checkpoint).
  c.total_steps = 30  # RL steps (one step = one rollout batch). Paper: up to 40 steps [P §1]. 0 = no RL: the
  #   warm start (if due) and the starting policy's evaluation only. The default job with 30: ~11 min on one
  #   H200 (BENCHMARKS.md "Main job").
  c.time_budget_s = 0.0  # Wall-clock budget of mode=train, seconds (0 = none): stops before a step that would
  #   leave no time for the closing evaluation, then evaluates and checkpoints the last step (kevin_jax/train.py).
  c.compilation_cache_dir = "~/.cache/kevin_jax/jax"  # JAX's persistent compilation cache: a job's learner step,
  #   sampler loops and SFT buckets compiled by an earlier process with the same programs are read back, not
  #   compiled again ('' = off; JAX_COMPILATION_CACHE_DIR in the environment wins). Trusted: never share it with
  #   users who can write to it.
  c.compilation_cache_min_compile_s = 1.0  # Programs that compiled faster than this, seconds, are not written.
  c.time_budget_eval_s = 0.0  # Estimate of one in-training evaluation, seconds, used by time_budget_s until one is
  #   measured (a resumed run, or evaluation.in_training_first=False); 0 = none.

  # --- Policy: the Flax NNX Qwen2 model. ---
  c.policy = ml_collections.ConfigDict()
  c.policy.preset = "small"  # Shape preset: tiny | small | qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-7b | qwq-32b.
  c.policy.checkpoint = ""  # Local HF directory (config.json + safetensors); '' = embedded default policy.
  c.policy.tokenizer = ""  # Tokenizer directory; '' = the checkpoint's, else the bundled small tokenizer.
  c.policy.param_dtype = "bfloat16"  # Parameter storage dtype: bfloat16 | float32.
  c.policy.compute_dtype = "bfloat16"  # Matmul/activation dtype; norms, softmax and logits stay fp32.
  c.policy.remat = "none"  # Per-layer rematerialisation: none | full | dots (save matmul outputs only).
  c.policy.attention_impl = "auto"  # Multi-token attention: auto (cudnn on a GPU in bf16, else xla) | xla | cudnn.
  c.policy.triton_gemm = True  # XLA's Triton GEMM fusions (False: cuBLAS for every matmul, slower 0.5B decode at
  #   batch 64).

  # --- Sampler: the jitted KV-cache generator. ---
  c.sampler = ml_collections.ConfigDict()
  c.sampler.temperature = 0.6  # Softmax temperature, train and eval. Paper: 0.9 [P §1 "Sampling"], set by the
  #   `paper` preset. The embedded 28M policy memorises its corpus and derails after one off-text token at 0.9
  #   (experiments/warm_start).
  c.sampler.top_p = 1.0  # Nucleus mass (1.0 = off).
  c.sampler.top_k = 0  # Top-k (0 = off).
  c.sampler.max_new_tokens = 2048  # Response budget per turn, tokens (warm-start targets reach ~2.8k). Paper: 16384, 22528 after step 30 [P §1].
  c.sampler.batch_size = 64  # Sequences decoded together, per generate call.
  c.sampler.prompt_buckets = (512, 1024, 2048, 4096, 8192)  # Prompt lengths (tokens) compiled once each.
  c.sampler.kv_cache_dtype = "bfloat16"  # KV-cache dtype.
  # The decode fast path (kevin_jax/policy/decode/): resolved once per shape, batch and GPU into a logged DecodePlan.
  c.sampler.decode_attention = "auto"  # Decode attention: auto (Pallas kernel on a GPU, else xla) | xla | pallas.
  c.sampler.decode_qkv = "auto"  # Decode q/k/v projection, RoPE and cache write: auto (one Pallas kernel on a GPU up
  #   to 64 rows, batch a multiple of 16) | xla | pallas.
  c.sampler.decode_out = "auto"  # Decode o projection + residual add: auto (one Pallas kernel on a GPU up to 64 rows,
  #   where the q/k/v kernel runs with the norm inside, decode_norm) | xla | pallas.
  c.sampler.decode_mlp = "auto"  # Decode SwiGLU front: auto (fused Pallas kernel on a GPU up to 64 rows) | xla | pallas.
  c.sampler.decode_down = "auto"  # Decode down projection: auto (split Pallas kernel on a GPU up to 64 rows where the
  #   hidden size is at most 1,024) | xla | pallas.
  c.sampler.decode_norm = "auto"  # Decode RMSNorms before the q/k/v and SwiGLU kernels: auto (inside on a GPU up to
  #   hidden size 1,024, else xla) | xla (XLA's norm fusion) | fold (the scale folded into the kernels' weights, XLA
  #   computes only 1/rms per row) | inside (the kernels compute 1/rms too).
  c.sampler.decode_stats = "auto"  # The draw's chunk maxima and sums of exp: auto (one Pallas pass on a GPU, for
  #   temperature sampling without top-k / top-p) | xla | pallas.

  # --- Rollout: the multi-turn refinement procedure [P §1 "Multi-turn procedure"]. ---
  c.rollout = ml_collections.ConfigDict()
  c.rollout.tasks_per_step = 2  # Tasks per RL step (2 x 16 x 4 = 128 turn-samples: the embedded default's
  #   time budget). Paper: 8 [P §1], set by the `paper` preset.
  c.rollout.trajectories = 16  # Parallel trajectories per task, m [P §1: 16].
  c.rollout.turns = 4  # Refinement turns per trajectory, n [P §1: 4 in training, 8 at test].
  c.rollout.max_context_tokens = 3072  # Prompt budget per turn, tokens; oldest earlier turns dropped first. The
  #   warm start's prompts are built within it too (sft.fit_prompts), and 3072 + sampler.max_new_tokens =
  #   sft.max_seq_len. Paper: 8192 [P §1 "Token budgets"], set by the `paper` preset.
  c.rollout.feedback_max_chars = 2000  # Evaluator feedback kept per earlier turn, characters.
  c.rollout.context_from_tasks = False  # At start, raise max_context_tokens to the job's longest first-turn task
  #   prompt (the policy's tokenizer, rounded up to 256 tokens; a prompt bucket added to match); a task that cannot
  #   fit the model's context with sampler.max_new_tokens stops the job, named (runtime.fit_context_to_tasks).
  c.rollout.save_turns = True  # Write every turn (prompt id, response, result) to workdir/rollouts/*.jsonl.

  # --- RL: Kevin's GRPO variant [P §2, §3]. ---
  c.rl = ml_collections.ConfigDict()
  c.rl.gamma = 0.4  # Turn discount: R_t = sum_{i>=t} gamma^(i-t) s_i [P §2 "Aggregation", best: sum, 0.4].
  c.rl.return_mode = "sum"  # Turn-return aggregation: sum | max [P §2].
  c.rl.adv_std_normalize = True  # Divide advantages by the per-task std [P eq. 1]; False = Dr. GRPO style.
  c.rl.adv_baseline = "mean"  # Baseline of a turn-sample's advantage: mean | leave_one_out over the task's m*n
  #   turn-samples [P eq. 1] | trloo: the mean return of the task's other trajectories at the same turn (turn-level
  #   leave-one-out, Dr. Kernel arXiv 2602.05885; use with adv_std_normalize=False for its unscaled form).
  c.rl.adv_eps = 1e-6  # Added to the std before dividing (all-equal groups get advantage 0).
  c.rl.negative_scale = 1.0  # Multiplier of negative advantages: 1 = GRPO [P eq. 1]; 0 = push only the
  #   above-baseline samples up (an ablation: experiments/toy_memorizer).
  c.rl.adv_prob_weight = 0.0  # alpha in [0, 1]: token advantages x (alpha * pi_old(token) + 1 - alpha); 0 = off
  #   (paper); 1 = improbable tokens (sampling noise) stop dominating the update (rl/grpo.py policy_loss).
  c.rl.shuffle_advantages = False  # Null control: permute advantages across the batch's turn-samples (same
  #   values, no signal): tells learning apart from drift in ablations. Never for real training.
  c.rl.epsilon_low = 0.2  # PPO clip below 1 [P §1: Clip-Higher 0.2/0.28].
  c.rl.epsilon_high = 0.28  # PPO clip above 1 (DAPO Clip-Higher) [P §1].
  c.rl.loss_agg = "constant"  # token_mean | seq_mean | constant (sum / loss_constant, Dr. GRPO) [P §3].
  c.rl.loss_constant = 2048.0  # Divisor for loss_agg=constant, tokens (Dr. GRPO: max response length).
  c.rl.kl_beta = 0.0  # Weight of KL to the starting policy (frozen copy; paper: 0 [P §1 "KL penalty"]).
  c.rl.kl_estimator = "k3"  # k1 | k3 (Schulman) KL estimator, used only when kl_beta > 0.
  c.rl.updates_per_batch = 2  # Optimizer steps per rollout batch (on-/off-policy pair) [P §1].
  c.rl.micro_batch_size = 8  # Sequences per device per gradient-accumulation micro-batch (memory, not math).
  c.rl.recompute_old_logps = True  # Recompute log pi_old with the learner's own forward before the updates
  #   (default: avoids sampler/learner numeric mismatch in the ratio); False = use the sampler's log-probs.
  c.rl.logits_chunk = 1024  # Positions per chunk of the log-prob computation (bounds fp32 [B, chunk, vocab]).
  c.rl.scan_layers = False  # Learner scans the decoder layers (Qwen2.hidden(scan=True)): needed for remat to save
  #   memory, but it copies the stacked layer weights every step (lower MFU: BENCHMARKS.md "Learner step").

  # --- Optimizer: Optax AdamW or SGD [P §1 "Learning rate", "Gradient clipping"]. ---
  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adamw"  # adamw (paper) | sgd (heavy-ball momentum b1; b2, eps unused): an ablation
  #   (rl/optimizer.py).
  c.optimizer.learning_rate = 1e-5  # Peak LR, constant after warmup. Paper: 2e-6 for QwQ-32B [P §1], set by the
  #   `paper` preset; the embedded 28M policy gets 30 steps x 2 updates, where 2e-6 would barely move it.
  c.optimizer.warmup_ratio = 0.03  # Fraction of total optimizer steps spent warming up linearly [P §1].
  c.optimizer.b1 = 0.9  # Adam beta1.
  c.optimizer.b2 = 0.999  # Adam beta2.
  c.optimizer.eps = 1e-8  # Adam epsilon.
  c.optimizer.weight_decay = 0.0  # Decoupled weight decay (OpenRLHF default 0).
  c.optimizer.max_grad_norm = 0.05  # Global-norm clip [P §3: 0.05 in the stabilised recipe].
  c.optimizer.state_dtype = "float32"  # Adam moment dtype: float32 | bfloat16.
  c.optimizer.master_weights = True  # With bfloat16 params, keep an fp32 master copy in the optimizer state
  #   (updates of ~lr=2e-6 vanish when rounded to bf16); ignored for float32 params.

  # --- Evaluator: sandboxed NVRTC/CuPy workers (never imported by the learner). ---
  c.evaluator = ml_collections.ConfigDict()
  c.evaluator.backend = "cuda"  # cuda (sandboxed GPU workers) | scripted (deterministic CPU test reward).
  c.evaluator.gpus = ""  # CUDA_VISIBLE_DEVICES for workers ('' = every visible GPU, shared with JAX).
  c.evaluator.workers_per_gpu = 1  # Worker slots per GPU (1 keeps timings clean).
  c.evaluator.compile_workers = 0  # NVRTC compile processes (0 = number of CPU cores, at most 16).
  c.evaluator.correctness_trials = 5  # Fresh random input sets checked per candidate (KernelBench: 5).
  c.evaluator.timing_runs = 100  # Timed launches per side, median taken (KernelBench: 100).
  c.evaluator.timing_max_s = 0.5  # Time budget of one candidate's timed runs, seconds (0 = none): past it (and
  #   timing_min_runs), stop early; the last run is validated (kernels/timing.py). The `paper` preset keeps 0
  #   (KernelBench's 100 runs). Half the timing, speedups within 1.2 %: BENCHMARKS.md "Evaluator".
  c.evaluator.timing_min_runs = 10  # Timed runs done before timing_max_s may stop them.
  c.evaluator.warmup_runs = 3  # Untimed launches per side before timing.
  c.evaluator.atol = 1e-4  # fp32 absolute tolerance (KernelBench today: 1e-4).
  c.evaluator.rtol = 1e-4  # fp32 relative tolerance.
  c.evaluator.correct_weight = 0.3  # Score weight of correctness: S = w*1[correct] + speedup*1[correct] [P §2].
  c.evaluator.speedup_cap = 0.0  # Cap on the speedup term (0 = none; the paper has none).
  c.evaluator.log_speedup = False  # Use log2(1 + speedup) instead of speedup in the score.
  c.evaluator.excessive_speedup = 10.0  # Speedups above this re-validate outputs captured during timing.
  c.evaluator.compile_timeout_s = 60.0  # Wall-clock limit for compiling one candidate, seconds.
  c.evaluator.run_timeout_s = 60.0  # Wall-clock limit per GPU phase of one candidate (correctness; timing), seconds.
  c.evaluator.eval_timeout_s = 120.0  # Wall budget of one evaluation (compile + correctness + timing; not the queue
  #   or the task's first load), seconds: past it the verdict is `timeout` and the worker is replaced.
  c.evaluator.recycle_after = 50  # Worker evaluations before it is replaced (leaked modules, __device__ state).
  c.evaluator.worker_host_memory_gb = 32.0  # RLIMIT_AS-style host memory cap per worker, GiB (0 = none).
  c.evaluator.jax_memory_fraction = 0.6  # GPU memory fraction JAX may take when workers share the GPU.
  c.evaluator.half_atol = 1e-2  # fp16/bf16 absolute tolerance (KernelBench: 1e-2); a task's ATOL overrides.
  c.evaluator.half_rtol = 1e-2  # fp16/bf16 relative tolerance.
  c.evaluator.task_timeout_s = 300.0  # Wall-clock limit for loading a task in a GPU worker (reference build), s.
  c.evaluator.kernel_timeout_s = 5.0  # One run of a candidate's plan longer than max(this, 100 x reference) = hang, s.
  c.evaluator.worker_start_timeout_s = 300.0  # A worker process must be ready within this many seconds.
  c.evaluator.timing_input_sets = 2  # Input buffer sets rotated during timing (>= 2; every run gets a fresh draw).
  c.evaluator.input_distributions = ("task", "normal", "uniform", "heavy", "shifted")  # Per correctness trial.
  c.evaluator.timed_inputs = "auto"  # fresh | rescaled | auto: fresh draws per timed run when a draw is cheap.
  c.evaluator.task_memory_fraction = 0.8  # A task whose evaluation needs more than this x the GPU's free memory
  #   (kernels/footprint.py: 3 params + 6 inputs + 4 outputs + a workspace) is skipped as a whole, an evaluator-side
  #   result (flags task_too_large, evaluator_error) that never enters the advantage; 0 = no budget. 0.8 leaves a
  #   fifth for what the estimate leaves out (allocator rounding, the L2 flush buffer, CUDA context).
  c.evaluator.result_cache = 8192  # Results kept for repeats of an identical (task, candidate) pair in later batches
  #   (later turns, steps and evaluations of the same job), LRU entries; 0 = evaluate every batch afresh. Timeouts
  #   and evaluator errors are never reused. Halves an RL step of the default: BENCHMARKS.md "Evaluator".
  c.evaluator.validate_fraction = 0.2  # Share of timed runs whose outputs are re-checked (plus first and last).
  c.evaluator.timing_graphs = "auto"  # CUDA-graph timing: auto (reference < graph_threshold_ms) | always | never.
  c.evaluator.graph_threshold_ms = 0.05  # Launch-bound cut-off for timing_graphs=auto, milliseconds.
  c.evaluator.ref_timing = "cached"  # cached (time the reference once per task/GPU/torch, then only on validated
  #   runs) | interleaved (time it in every evaluation: the evaluator library's default).
  c.evaluator.profile_phases = False  # CUDA events around each phase of an evaluation: details.breakdown.gpu_ms
  #   (the host wall-clock split, details.breakdown.host_ms, is always there; kernels/phases.py).
  c.evaluator.flush_bytes = 0  # L2 flush buffer, bytes (0 = max(2 x L2, 256 MiB)).
  c.evaluator.cache_dir = ""  # NVRTC cubin cache, reference-time cache, worker logs, task-hygiene records and the
  #   warm start's token cache (tokens/: policy/token_cache.py) ('' = ~/.cache/kevin_jax/evaluator).
  c.evaluator.arch = ""  # Cubin target, e.g. 'sm_90' ('' = the GPU's own; sm_90 for compile-only checks).
  c.evaluator.seed = -1  # Input-draw seed (-1 = secret, fresh per evaluation; >= 0 only for debugging).
  c.evaluator.nvrtc_pch = True  # NVRTC automatic precompiled headers in compile workers (NVRTC >= 12.8).
  c.evaluator.max_static_device_bytes = 256 * 2**20  # Cap on a candidate's static __device__ memory, bytes.
  c.evaluator.max_local_memory_bytes = 4 * 2**30  # Cap on local memory per thread x resident threads, bytes.
  c.evaluator.compile_memory_gb = 32.0  # Host memory all compile workers together may add to their start-up size, GiB.
  c.evaluator.spare_workers = True  # Keep one pre-started spare GPU worker per slot (instant replacement).
  c.evaluator.dedupe = True  # Evaluate identical (task, candidate) pairs of a batch once.
  c.evaluator.feedback_max_chars = 2000  # Length limit of the feedback message, characters.
  c.evaluator.compile_baseline = False  # Also time the reference under torch.compile (a second reference timing,
  #   as KernelBench reports; kernels/compile_baseline.py): result field speedup_compile, 'n/a' if it fails.

  # --- Tasks: the bundled suite or a KernelBench checkout. ---
  c.tasks = ml_collections.ConfigDict()
  c.tasks.source = "bundled"  # 'bundled' | 'generated' (the seeded task world of kevin_jax/data/taskgen, sized by
  #   tasks.world_*; splits train, heldout_compositions, heldout_styles, suite) | a task-world directory
  #   (world.json) | path to a KernelBench-style directory | path to one task file.
  c.tasks.world_seed = 0  # Seed of the generated world: the same seed and quotas give byte-identical task files.
  c.tasks.world_train = 160  # Generated training tasks per family (5 families: elementwise, reduce, matmul,
  #   pool, scan; kevin_jax/data/README.md).
  c.tasks.world_heldout_compositions = 24  # Generated tasks per family whose op chain holds an op pair never seen
  #   together in training (held out by a sha256 rule on the pair) and a size never seen in training.
  c.tasks.world_heldout_styles = 16  # Generated tasks per family of training compositions whose warm-start corpus
  #   entries are naive kernels only: a faster correct kernel there is not a copy of any corpus response.
  c.tasks.layout = "any"  # What tasks.source must be: any | kernelbench (a checkout's KernelBench/ folder with a
  #   level<N>/ folder for every tasks.levels; checked at start, the error names what was looked for).
  c.tasks.source_commit = ""  # The task source's commit, for reports ('' = read from the checkout's .git, else
  #   'unknown').
  c.tasks.levels = (1, 2)  # Levels loaded from a KernelBench directory (level1/, level2/ ...).
  c.tasks.train_ids = ()  # Explicit training task ids ('level1/19_ReLU'); () = deterministic split.
  c.tasks.test_ids = ()  # Explicit held-out task ids; () = the complement of train_ids.
  c.tasks.test_fraction = 0.25  # Held-out share per level when splitting automatically.
  c.tasks.split_seed = 0  # Seed of the deterministic split.
  c.tasks.hygiene = "auto"  # Task hygiene at load (kernels/hygiene.py): degenerate, non-deterministic or unloadable
  #   tasks leave the task list, reported in workdir/task_hygiene.md; 'auto' = on for KernelBench and other external
  #   sources, off for the bundled suite and the generated world (gated by their tests) | 'on' | 'off'.

  # --- Evaluation runs (mode=evaluate): best@k / avg@k / fast_p, test-time scaling [P §4]. ---
  c.evaluation = ml_collections.ConfigDict()
  c.evaluation.checkpoint = ""  # Orbax workdir or HF directory to evaluate ('' = this workdir's latest).
  c.evaluation.split = "test"  # Which tasks: test | train | all; a task world also has heldout_compositions |
  #   heldout_styles | suite, and its test = heldout_compositions + suite (the tasks without corpus entries).
  c.evaluation.max_tasks = 0  # Evaluate at most this many tasks of the split (0 = all).
  c.evaluation.trajectories = 16  # Parallel trajectories per task, k in best@k [P Table 1: 16].
  c.evaluation.turns = 8  # Refinement turns per trajectory [P Table 1: 8 at test time].
  c.evaluation.temperature = -1.0  # Sampling temperature of every evaluation (in-training and mode=evaluate);
  #   -1 = sampler.temperature (the rollouts'), 0 = greedy. Lets RL rollouts sample hotter than the evaluations.
  c.evaluation.budgets = ((16, 8), (32, 4), (128, 1))  # (trajectories, turns) at a fixed kernel budget [P Table 2].
  c.evaluation.standard_report = False  # Also write the field's standard report (kevin_jax/report/standard.py):
  #   per level and split correct %, fast_p, geometric-mean speedups vs eager and torch.compile, per-task table.
  c.evaluation.beam = False  # Also run the blog's beam search (keep best, clone, continue).
  c.evaluation.beam_width = 4  # Trajectories kept per round [blog: best 4 of 16].
  c.evaluation.beam_clones = 4  # Copies of each kept trajectory [blog: 4x, back to 16].
  c.evaluation.beam_rounds = 2  # Rounds of (turns_per_round turns, select, clone).
  c.evaluation.beam_turns_per_round = 4  # Turns per beam round [blog: 4 steps].
  # Evaluations inside the RL job (mode=train) of the current policy on fixed task splits: before step 1, every
  # in_training_every steps and after the last step, with the same sampling seed each time (paired before/after
  # numbers). Writes workdir/eval_metrics.jsonl (step 0 = the starting policy) and eval_rollouts/.
  c.evaluation.in_training_splits = ("train", "test")  # Splits to evaluate (() = none).
  c.evaluation.in_training_every = 0  # Also every N RL steps (0 = only before the first and after the last).
  c.evaluation.in_training_first = True  # Evaluate the starting policy before step 1 (False: skip it, e.g. when an
  #   earlier run with the same seed and starting weights already has it: its sampling seed is the same).
  c.evaluation.in_training_trajectories = 4  # Parallel trajectories per task, k.
  c.evaluation.in_training_turns = 4  # Turns per trajectory (the training rollout's 4).
  c.evaluation.in_training_max_tasks = 0  # At most this many tasks per split, in split order (0 = all; a task
  #   world's splits interleave its families, so any prefix is stratified).
  c.evaluation.novelty_ngram = 4  # n of the token n-gram Jaccard in the novelty metric (rl/kernel_metrics.py:
  #   correct kernels that are not copies of a warm-start corpus response; reported per split); 0 = off.

  # --- Supervised warm start (mode=sft, configs/sft.py, kevin_jax/sft.py): cross-entropy on response tokens. ---
  c.sft = ml_collections.ConfigDict()
  c.sft.corpus = ""  # JSONL, one {"messages": [...], "response": "..."} per line; '' = the bundled suite's
  #   corpus (kevin_jax/data/export_corpus.py: single-turn + feedback episodes if data/suite_results.json exists).
  c.sft.corpus_sources = ()  # Task sources whose corpora the warm start trains on when sft.corpus is '' (() =
  #   tasks.source's own). A task world gives its warm-start splits (train, heldout_styles), any other source all
  #   its tasks. The KernelBench job, whose tasks have no solutions: ('bundled', 'generated').
  c.sft.corpus_kinds = ("single", "fix_wrong", "speed_up", "fix_then_speed_up", "retry_format", "keep_fast",
                        "fast_then_format", "format_twice", "first_wrong", "slow_again",
                        "wrong_again")  # Example kinds of the bundled corpus (export_corpus.ALL_KINDS, the
  #   "mixture" warm start): turn 1 -> naive, optimized or a known-wrong variant (single, first_wrong); after
  #   feedback -> the optimized solution (fix_wrong, speed_up, fix_then_speed_up) or, as often, not acting on it
  #   (slow_again: naive again; wrong_again: another wrong variant); the later-turn prompts rollouts produce after a
  #   format error or the fast solution (retry_format, keep_fast, fast_then_format, format_twice). Which corpora
  #   let RL improve the policy: experiments/warm_start.
  c.sft.corpus_reasoning = "plain"  # Later-turn reasoning of the bundled corpus: plain (only the kind of outcome,
  #   the task and the plan) | quote (the previous feedback's text and timings; export_corpus.py docstring).
  c.sft.epochs = 30.0  # Passes over the training examples (used when sft.steps == 0).
  c.sft.steps = 0  # Optimizer steps; 0 = ceil(epochs * training examples / batch_size).
  c.sft.batch_size = 16  # Sequences per optimizer step, global (a multiple of micro_batch_size x data-parallel);
  #   small, so a corpus of a few hundred examples still gives ~20 updates per epoch.
  c.sft.micro_batch_size = 8  # Sequences per device per gradient-accumulation micro-batch (memory, not math).
  c.sft.learning_rate = 5e-4  # Peak LR. From-scratch LMs of 14-70M params train at ~1e-3 with 2M-token batches
  #   (Pythia); our ~50k-token batches are noisier, so half that (RL's 2e-6 would barely move random weights).
  c.sft.warmup_ratio = 0.05  # Share of steps with linear warmup.
  c.sft.final_lr_ratio = 0.1  # Cosine decay from the peak to this share of it at the last step.
  c.sft.b2 = 0.95  # Adam beta2 (LM-pretraining value, steadier at high LR than 0.999); beta1, eps: optimizer.*.
  c.sft.weight_decay = 0.0  # Decoupled weight decay (the goal includes reproducing the corpus kernels).
  c.sft.max_grad_norm = 1.0  # Global-norm clip (> 0; keeps the optimizer-state layout of the RL learner).
  c.sft.max_seq_len = 5120  # Longest example, tokens (prompt + response + end-of-turn): RL's
  #   rollout.max_context_tokens + sampler.max_new_tokens. Longer ones are dropped (counted in the log).
  c.sft.fit_prompts = True  # Bundled corpus: build each later-turn prompt as the rollout does, within
  #   rollout.max_context_tokens, oldest earlier attempts dropped first (rl/sft_data.rollout_fit); False = every
  #   earlier attempt, however long (examples over max_seq_len are then dropped).
  c.sft.truncate = False  # True: cut over-long responses at max_seq_len instead of dropping the example.
  c.sft.input_noise = 0.0  # Share of response tokens the model reads replaced by another token of the same
  #   response (targets unchanged; rl/sft_data.make_batch): robustness to the sampler's own deviations. 0 = off.
  c.sft.seq_buckets = (1024, 2048, 3072, 4096)  # Padded lengths (tokens), one compile each; + max_seq_len.
  c.sft.length_group = 8  # Batches per window sorted by length (less padding); 1 = plain shuffling.
  c.sft.exclude_test_tasks = True  # Never train on the tasks split's test tasks (clean RL held-out eval);
  #   their examples give the heldout_tasks/loss curve.
  c.sft.eval_fraction = 0.1  # Share of the other examples held out for the eval/loss curve.
  c.sft.eval_every_steps = 50  # Held-out loss + greedy format check every N steps and at the end (0 = never).
  c.sft.eval_max_examples = 256  # Cap on each held-out set's examples per eval (0 = all).
  c.sft.sample_prompts = 8  # Held-out prompts decoded greedily at each eval (sample/parse_rate); 0 = none.
  c.sft.sample_max_new_tokens = 1024  # Response budget of those greedy samples, tokens.
  c.sft.checkpoint_every_steps = 100  # Orbax save every N steps (and at the last step).
  c.sft.export_hf = True  # At the end, also write workdir/hf (HF safetensors + tokenizer files).
  c.sft.before_rl = True  # mode=train from random init (no init_from / policy.checkpoint / RL checkpoint): run
  #   this warm start into workdir/sft first (kevin_jax.sft.warm_start) and start RL from workdir/sft/hf.

  # --- Mesh: all partitioning rules live in kevin_jax/sharding.py. ---
  c.mesh = ml_collections.ConfigDict()
  c.mesh.axes = (("fsdp", -1), ("tensor", 1))  # (name, size); exactly one -1 is filled with the rest.

  # --- Checkpoints (Orbax) in workdir/checkpoints. ---
  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 5  # Save every k RL steps (and always at the last step).
  c.checkpoint.keep = 3  # Keep the last K checkpoints.
  c.checkpoint.export_hf = True  # After the last RL step, also write workdir/hf (HF safetensors + tokenizer): the
  #   trained policy for transformers or for --config.init_from / evaluation.checkpoint of another run. Written
  #   before the closing evaluation, so a job killed during it keeps the weights.

  # --- Logging: workdir/metrics.jsonl and TensorBoard events. ---
  c.logging = ml_collections.ConfigDict()
  c.logging.tensorboard = True  # Also write TensorBoard event files (tensorboardX).
  c.logging.progress_every_s = 10.0  # Seconds between progress lines on long loops.

  _apply_presets(c, arg)
  return c


def _apply_presets(c: ml_collections.ConfigDict, arg: str) -> None:
  presets = [a for a in arg.split(",") if a]
  for name in presets:
    if name == "runlocal":  # The whole job on a 2-core CPU (scripted reward) in 1-2 minutes, under 4 GB.
      c.total_steps = 2
      c.policy.preset = "tiny"
      c.policy.param_dtype = "float32"
      c.policy.compute_dtype = "float32"
      c.sampler.max_new_tokens = 64
      c.sampler.batch_size = 4  # 2 tasks x 2 trajectories: one prefill per turn, no padding rows.
      c.sampler.prompt_buckets = (256, 512, 1024, 2048)
      c.rollout.tasks_per_step = 2
      c.rollout.trajectories = 2
      c.rollout.turns = 2
      c.rollout.max_context_tokens = 1984  # Bundled first-turn prompts: <= 1.8k tokens; + 64 = one 2048 bucket.
      c.rl.loss_constant = 64.0
      c.rl.micro_batch_size = 2  # 2 rows x 2048 tokens: ~1 GiB of XLA attention temporaries (host_memory.py).
      c.evaluator.correctness_trials = 2
      c.evaluator.timing_runs = 10
      c.checkpoint.every_steps = 1
      c.evaluation.in_training_splits = ("test",)
      c.evaluation.in_training_trajectories = 2
      c.evaluation.in_training_turns = 2
      c.evaluation.in_training_max_tasks = 2
      # The warm start: 2 steps of 4 sequences at RL's length (2048 = 1984 + 64), first attempts only.
      c.sft.corpus_kinds = ("single",)
      c.sft.steps = 2
      c.sft.batch_size = 4
      c.sft.micro_batch_size = 2
      c.sft.max_seq_len = 2048
      c.sft.seq_buckets = ()
      c.sft.truncate = True  # Responses are cut at max_seq_len (the prompts take ~1.6-1.8k of it).
      c.sft.eval_every_steps = 2
      c.sft.eval_max_examples = 4
      c.sft.sample_prompts = 2
      c.sft.sample_max_new_tokens = 16
      c.sft.checkpoint_every_steps = 2
    elif name == "paper":
      c.total_steps = 40  # [P §1: "up to 40 steps (80 gradient steps)"].
      c.optimizer.learning_rate = 2e-6  # [P §1].
      c.evaluator.timing_max_s = 0.0  # Every candidate gets all its timed runs, as in KernelBench.
      c.policy.preset = "qwq-32b"
      c.sampler.temperature = 0.9  # [P §1 "Sampling"].
      c.sampler.max_new_tokens = 16384  # [P §1]; raise to 22528 at step 30 by resuming with an override.
      c.sampler.batch_size = 128
      c.rollout.tasks_per_step = 8
      c.rollout.trajectories = 16
      c.rollout.turns = 4
      c.rollout.max_context_tokens = 8192  # max_prompt_length 8192 [P §1 "Token budgets"].
      c.rl.loss_constant = 16384.0
      c.rl.micro_batch_size = 1
      c.policy.remat = "full"
      c.rl.scan_layers = True  # Remat only saves memory with scanned layers (Qwen2.hidden(scan=True)).
      c.tasks.source = "KernelBench/KernelBench"  # Point at a local checkout.
      c.tasks.layout = "kernelbench"
      from configs import kernelbench  # pylint: disable=g-import-not-at-top
      c.tasks.train_ids, c.tasks.test_ids = kernelbench.split_ids()  # 90+90 train, 10+10 held out [P §1].
      c.evaluation.in_training_splits = ("test",)  # The 20 held-out tasks ...
      c.evaluation.in_training_every = 10  # ... every 10 steps.
      c.mesh.axes = (("fsdp", -1), ("tensor", 1))  # Pure FSDP over 8 GPUs.
      c.checkpoint.export_hf = False  # QwQ-32B: ~65 GB of safetensors gathered by one host; turn on to keep one.
    elif name == "world":  # The generated task world (kevin_jax/data/taskgen) instead of the bundled suite.
      c.tasks.source = "generated"
      c.evaluation.in_training_splits = ("train", "heldout_compositions", "heldout_styles", "suite")
      c.evaluation.in_training_max_tasks = 20  # Per split: 4 per family (the splits interleave families).
      c.sft.steps = 1500  # A fixed count, not 30 epochs: the world's corpus (train + heldout_styles, ~5k examples)
      #   would take ~9k steps; 1,500 is ~1.4x the default job's warm start on the bundled corpus.
      c.time_budget_s = 900.0  # The whole job (warm start, step-0 evaluation, RL, closing evaluation) within ~15 min
      #   on one GPU: RL stops at the step that leaves just room for the closing evaluation.
    else:
      raise ValueError(f"unknown preset {name!r} in '{arg}'; known: runlocal, paper, world")
  if "world" in presets and "runlocal" in presets:  # In either order: a small world, every split, one task each.
    c.tasks.world_train = 4  # Tasks per family: the world and its corpus are built in seconds.
    c.tasks.world_heldout_compositions = 1
    c.tasks.world_heldout_styles = 1
    c.total_steps = 1
    c.time_budget_s = 0.0
    c.sft.steps = 1
    c.sft.eval_every_steps = 0  # No held-out loss or samples in the warm start.
    c.evaluation.in_training_splits = ("train", "heldout_compositions", "heldout_styles", "suite")
    c.evaluation.in_training_max_tasks = 1
    c.sampler.max_new_tokens = 32  # Short decodes for the 10 generate calls (8 evaluations, 2 RL turns).
    c.rl.loss_constant = 32.0
    c.evaluation.in_training_trajectories = 4  # 4 x 1 per split: the RL step's decode batch of 4, compiled once.
    c.evaluation.in_training_turns = 1
