"""What the Megatron-LM importer makes of flags that set no config field: flags without
an effect on a step's time or memory, flags whose effect is not modelled (each with its
reason, said back to the user), Megatron's defaults for flags a script leaves out, and the
vocabularies of the tokenizers that fix one."""

from __future__ import annotations

IGNORED_VALUED = {"--group-query-attention", "--use-megatron-fsdp", "--use-custom-fsdp", "--deepspeed_config"}  # flags that need no field (FSDP: its sharding strategy; DeepSpeed: its config file)
# flags that change neither time nor memory of a training step (the optimizer's
# hyper-parameters, data, tokenizer, logging, checkpoints, initialisation, exit
# conditions): listed back together, apart from the ones that may matter
NO_EFFECT = frozenset({
    "--use-mcore-models", "--lr", "--min-lr", "--decoupled-lr", "--decoupled-min-lr", "--lr-decay-style", "--lr-decay-iters",
    "--lr-decay-samples", "--lr-warmup-iters", "--lr-warmup-samples", "--lr-warmup-fraction", "--lr-warmup-init",
    "--weight-decay", "--start-weight-decay", "--end-weight-decay", "--weight-decay-incr-style", "--adam-beta1",
    "--adam-beta2", "--adam-eps", "--clip-grad", "--init-method-std", "--seed", "--train-iters", "--train-samples",
    "--eval-iters", "--eval-interval", "--save", "--load", "--save-interval", "--log-interval", "--log-throughput",
    "--log-timers-to-tensorboard", "--log-validation-ppl-to-tensorboard", "--log-memory-to-tensorboard",
    "--tensorboard-dir", "--wandb-project", "--wandb-exp-name", "--wandb-save-dir", "--data-path", "--data-cache-path",
    "--split", "--mock-data", "--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file", "--num-workers",
    "--dataloader-type", "--exit-duration-in-mins", "--exit-interval", "--distributed-timeout-minutes",
    "--ckpt-format", "--no-load-optim", "--no-load-rng", "--finetune", "--timing-log-level", "--apply-layernorm-1p",
    "--calculate-per-token-loss", "--fp8-amax-compute-algo", "--fp8-amax-history-len", "--no-create-attention-mask-in-dataloader",
    "--attention-softmax-in-fp32", "--no-position-embedding", "--use-rotary-position-embeddings", "--profile",
    "--profile-step-start", "--profile-step-end", "--use-pytorch-profiler",
    "--norm-epsilon", "--moe-aux-loss-coeff", "--moe-router-bias-update-rate", "--mtp-loss-scaling-factor",
    "--rotary-scaling-factor", "--mscale", "--mscale-all-dim", "--moe-enable-deepep", "--enable-experimental",
    "--distributed-backend", "--async-save", "--dist-ckpt-strictness", "--exit-signal-handler", "--no-mmap-bin-files",
    "--te-rng-tracker", "--inference-rng-tracker", "--use-cpu-initialization", "--tp-comm-bootstrap-backend",
    "--use-rope-scaling", "--rotary-seq-len-interpolation-factor", "--moe-token-drop-policy",
    "--rampup-batch-size",  # the first iterations' smaller batches; steady steps run the global batch
    # Muon's hyper-parameters: the same kernels whatever their values
    "--muon-momentum", "--muon-nesterov", "--muon-scale-mode", "--muon-coefficient-type", "--muon-extra-scale-factor",
    "--apply-query-key-layer-scaling",  # folded into the softmax scale (dot_product_attention.py)
    # RoPE variants: the same rotation kernel over the same elements, other frequencies
    "--rope-type", "--rope-scaling-factor", "--mrope-section", "--yarn-original-max-position-embeddings", "--yarn-beta-fast",
    "--yarn-beta-slow", "--yarn-correction-range-round-to-int", "--no-yarn-correction-range-round-to-int",
    "--rotary-interleaved",
    # initialisation, learning-rate and weight-decay schedules
    "--embedding-init-method-std", "--init-model-with-meta-device", "--data-parallel-random-init",
    "--init-method-xavier-uniform", "--no-weight-decay-cond-type", "--lr-wsd-decay-style", "--lr-wsd-decay-iters",
    "--lr-wsd-decay-samples", "--override-opt_param-scheduler", "--override-opt-param-scheduler",
    "--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler", "--warmup",
    # fp16 dynamic loss scaling's hyper-parameters (the scaler's own work is a few scalars)
    "--loss-scale", "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis",
    "--fp8-margin", "--fp8-interval",  # delayed scaling's margin; the interval is deprecated (TE updates every step)
    # launch, evaluation, data paths, tokenizer details, logging, checkpoints, fault tolerance
    "--local-rank", "--lazy-mpu-init", "--nccl-communicator-config-path", "--disable-gloo-process-groups",
    "--distributed-timeout-seconds-after-init", "--fake-process-group", "--dump-param-to-param-group-map",
    "--exit-signal", "--exit-signal-handler-for-dataloader", "--exit-signal-handler-for-training", "--iterations-to-skip",
    "--start-eval-at-iter", "--eval-global-batch-size", "--eval-micro-batch-size", "--full-validation",
    "--multiple-validation-sets", "--validation-set-names",
    "--train-data-path", "--valid-data-path", "--test-data-path", "--data-args-path", "--per-split-data-args-path",
    "--per-dataset-sequences-path", "--dataloader-fast-cache-load", "--dataloader-defer-npy-index-mmap",
    "--num-dataset-builder-threads", "--object-storage-cache-path", "--mid-level-dataset-surplus",
    "--allow-ambiguous-pad-tokens", "--eod-mask-loss", "--tokenizer-metadata", "--tokenizer-special-tokens",
    "--tokenizer-sentencepiece-legacy", "--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
    "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces", "--tokenizer-hf-no-use-fast",
    "--tokenizer-hf-no-include-special-tokens", "--trust-remote-code", "--null-tokenizer-eod-id", "--null-tokenizer-pad-id",
    "--chat-template", "--log-progress", "--timing-log-option", "--tensorboard-log-interval", "--tensorboard-queue-size",
    "--no-log-loss-scale-to-tensorboard", "--disable-log-loss-scale-to-tensorboard", "--log-memory-interval",
    "--log-device-memory-used", "--log-world-size-to-tensorboard", "--wandb-entity", "--logging-level", "--log-energy",
    "--log-straggler", "--straggler-ctrlr-port", "--straggler-minmax-count", "--disable-straggler-on-startup",
    "--run-workload-inspector-server", "--config-logger-dir", "--profile-ranks", "--record-memory-history",
    "--memory-snapshot-path", "--record-shapes", "--nvtx-ranges", "--no-one-logger", "--enable-ft-package",
    "--calc-ft-timeouts", "--ft-num-warmup-iters", "--rerun-mode", "--check-for-spiky-loss", "--enable-msc", "--disable-msc",
    "--use-dist-ckpt", "--pretrained-checkpoint", "--use-checkpoint-args", "--use-mp-args-from-checkpoint-args",
    "--no-use-tokenizer-model-from-checkpoint-args", "--disable-use-tokenizer-model-from-checkpoint-args",
    "--exit-on-missing-checkpoint", "--auto-detect-ckpt-format", "--async-strategy", "--use-persistent-ckpt-worker",
    "--load-main-params-from-ckpt", "--persistent-save-interval", "--save-retain-interval", "--no-save-optim",
    "--no-save-rng", "--override-ckpt-iteration", "--verify-integrity", "--no-stream-ckpt-dequant",
    "--disable-stream-ckpt-dequant", "--no-strict-fsdp-dtensor-load", "--disable-strict-fsdp-dtensor-load",
    "--distrib-optim-fully-reshardable-mem-efficient", "--replication", "--replication-jump", "--replication-factor",
    # megatron-core 0.19's GPTModel stores it and never reads it: vocab_parallel_cross_entropy
    # upcasts the logits whatever it says (tensor_parallel/cross_entropy.py)
    "--fp16-lm-cross-entropy",
    # DSA indexer details inside its kernels: the ReLU on the scores, RoPE's layout, the norm's epsilon
    "--no-dsa-indexer-scoring-relu", "--disable-dsa-indexer-scoring-relu", "--dsa-indexer-rope-interleaved",
    "--dsa-indexer-k-norm-epsilon",
    "--apply-wd-to-qk-layernorm", "--head-lr-mult",  # weight-decay groups, the output layer's learning rate
    "--sft-tokenizer-prompt-format", "--tiktoken-pattern", "--tiktoken-num-special-tokens",  # tokenizer details
    # serving-time and other models' options a GPT pretraining step does not read
    "--flash-decode", "--enable-chunked-prefill", "--decode-only-cuda-graphs", "--mlp-chunks-for-prefill",
    "--nccl-all-reduce-for-prefill", "--use-legacy-static-engine", "--num-speculative-tokens", "--cache-mla-latents",
    "--max-tokens-to-oom", "--refit-method", "--indexer-batch-size", "--indexer-log-interval", "--embedding-path",
    "--evidence-data-path", "--titles-data-path", "--block-data-path", "--query-in-block-prob", "--use-one-sent-docs",
    "--short-seq-prob", "--num-classes", "--num-channels", "--patch-dim", "--iter-per-epoch", "--classes-fraction",
    "--data-per-class-fraction", "--vocab-extra-ids", "--encoder-num-layers", "--encoder-seq-length",
    "--output-bert-embeddings", "--perform-rl-step", "--lion-beta1", "--lion-beta2", "--sgd-momentum",
    "--no-barrier-with-level-1-timing", "--no-ckpt-fully-parallel-save", "--no-ckpt-load-validate-sharding-integrity",
    "--disable-ckpt-load-validate-sharding-integrity", "--result-rejected-tracker-filename",
    "--check-weight-hash-across-dp-replicas-interval", "--gpu-sniff-test-interval",
})
# whole families of 0.19 flags that no training step reads: checkpoint saving and loading,
# logging and tracing, serving-time inference, fault tolerance and its test tooling
NO_EFFECT_FAMILIES = (
    "--ckpt-", "--dist-ckpt-", "--async-ckpt-", "--non-persistent-", "--save-", "--flight-recorder-",
    "--no-flight-recorder-", "--disable-flight-recorder-", "--pytorch-profiler-", "--moe-routing-trace-", "--logits-save-",
    "--one-logger-", "--app-tag-", "--inprocess-", "--error-injection-", "--fault-injector-", "--adlr-autoresume",
    "--inference-", "--mamba-inference-", "--fim-",
    # other training modes and models than GPT pretraining: reinforcement learning, distillation
    # from saved logits, vision, BERT / T5 / retrieval
    "--rl-", "--no-rl-", "--grpo-", "--langrl-", "--logits-load-", "--no-inference-", "--dino-", "--vision-", "--swin-",
    "--img-", "--bert-", "--ict-", "--biencoder-", "--retriever-",
)
# the same for flags of Megatron-LM <= 2022 scripts that 0.19 no longer has
OLDER_NO_EFFECT = frozenset({
    "--no-scatter-gather-tensors-in-pipeline",  # whole activations over P2P, as modelled (megatron-core's)
    "--cpu-offloading-activations",  # TE's layer offload moves the activations: the default, as modelled
})


# tokenizers whose vocabulary is fixed (megatron-core tokenizers/text/libraries/
# megatron_hf_tokenizer.py: gpt2, bert-large-uncased, bert-large-cased)
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "BertWordPieceLowerCase": 30522, "BertWordPieceCase": 28996}

# flags with a real effect the model leaves out, and why (said back, not silently ignored)
_GC = "Python's garbage collection timing: steps are predicted without collector pauses"
_GRAPHS = "CUDA graphs: host launch gaps, which graph replay removes, are not modelled, nor the graphs' static buffers"
_LOG = "an extra pass over the parameters or gradients on every logged step"
NOT_MODELLED = {
    "--manual-gc": _GC, "--manual-gc-interval": _GC, "--manual-gc-eval": _GC, "--no-manual-gc-eval": _GC,
    "--disable-manual-gc-eval": _GC,
    "--log-params-norm": _LOG, "--log-num-zeros-in-grad": _LOG,
    "--empty-unused-memory-level": "torch.cuda.empty_cache between steps: the allocator's time and its cache",
    "--tp-comm-overlap-cfg": "userbuffers settings from a file: TransformerEngine's defaults are modelled",
    "--moe-input-jitter-eps": "one element-wise pass over the router's input",
    "--dsa-indexer-k-norm-fp32": "the DSA indexer's key norm in fp32: two casts of a [tokens, head dim] tensor",
    "--fp32-residual-connection": "the residual stream in fp32: its activations and element-wise passes at 4 bytes",
    "--deterministic-mode": "deterministic kernels (slower attention backward and reductions)",
    "--mlp-chunks-for-training": "the MLP run in sequence chunks (its transient memory)",
    # (Megatron-LM 0.19 no longer parses it; TE 2.x's get_cpu_offload_context takes it and
    # warns "Offloading weights is deprecated. Using offload_weights=True does not have any effect.")
    "--cpu-offloading-weights": "TransformerEngine 1.x's weight offload; TE 2.x ignores it as deprecated",
    **dict.fromkeys(("--use-transformer-engine-op-fuser", "--fused-residual-rmsnorm"),
                    "TransformerEngine's fusions of element-wise work: the unfused traffic is modelled"),
    **dict.fromkeys(("--distribute-saved-activations", "--distribute-checkpointed-activations"),
                    "each recomputed layer's saved input split over the tensor-parallel ranks: it is kept whole"),
    **dict.fromkeys(("--no-bias-dropout-fusion", "--no-bias-gelu-fusion", "--no-persist-layer-norm"),
                    "an unfused element-wise kernel chain: the fused kernel's traffic is modelled"),
    "--moe-per-layer-logging": "a small all-reduce of per-layer MoE statistics on logged steps",
    **dict.fromkeys(("--squared-relu", "--openai-gelu", "--use-te-activation-func"),
                    "the MLP's activation is costed as GeLU's element-wise pass (the same GEMMs)"),
    "--no-gradient-reduce-div-fusion": "the gradient scaling as a separate pass before the reduce",
    **dict.fromkeys(("--tp-comm-overlap-rs-dgrad", "--disable-tp-comm-overlap-ag", "--no-tp-comm-overlap-ag",
                     "--disable-tp-comm-overlap-rs", "--no-tp-comm-overlap-rs", "--disable-tp-comm-bulk-dgrad",
                     "--no-tp-comm-bulk-dgrad", "--disable-tp-comm-bulk-wgrad", "--no-tp-comm-bulk-wgrad",
                     "--disable-tp-comm-split-ag", "--no-tp-comm-split-ag", "--disable-tp-comm-split-rs",
                     "--no-tp-comm-split-rs"), "userbuffers settings: TransformerEngine's defaults are modelled"),
    **dict.fromkeys(("--ddp-num-buckets", "--ddp-pad-buckets-for-high-nccl-busbw", "--align-grad-reduce",
                     "--no-align-grad-reduce", "--disable-align-grad-reduce", "--align-param-gather",
                     "--no-align-param-gather"), "DDP bucket layout and launch options: Megatron's defaults are modelled"),
    **dict.fromkeys(("--enable-cuda-graph", "--cuda-graph-scope", "--cuda-graph-impl", "--external-cuda-graph",
                     "--cuda-graph-warmup-steps", "--cuda-graph-modules", "--optimizer-cuda-graph",
                     "--delay-offload-until-cuda-graph"), _GRAPHS),
    **dict.fromkeys(("--qk-clip", "--qk-clip-alpha", "--qk-clip-threshold"),
                    "Muon's QK-clip: the max attention logit per head kept in forward, q / k weights rescaled after each step"),
    "--log-max-attention-logit": "the max attention logit per head kept in forward for logging",
    "--mla-down-proj-fusion": "MLA's q and kv down-projections (and the input norm) in one fused GEMM: the same FLOPs, "
                              "fewer launches",
    **dict.fromkeys(("--use-grouped-gemm-for-shared-expert", "--use-grouped-gemm-for-dense-mlp"),
                    "TransformerEngine's grouped SwiGLU fusion for a one-group MLP: its element-wise passes fused "
                    "(the same GEMMs)"),
    **dict.fromkeys(("--moe-paged-stash", "--moe-paged-stash-page-size", "--moe-paged-stash-buffer-size-factor-cpu",
                     "--moe-paged-stash-buffer-size-factor-cuda"), "routed experts' saved activations in paged buffers"),
    "--check-for-large-grads": "a check over the gradients on every step",
    "--batch-invariant-mode": "batch-invariant (deterministic) kernels, slower than the default ones",
    "--disable-bf16-reduced-precision-matmul": "bf16 GEMMs without reduced-precision accumulation",
    "--ddp-reduce-scatter-with-fp32-accumulation": "the gradient reduce-scatter as an all-to-all with fp32 accumulation",
    "--moe-router-force-biased": "a random bias on the router's logits (how evenly tokens spread)",
    **dict.fromkeys(("--activation-offload-fraction", "--min-offloaded-tensor-size",
                     "--fine-grained-offloading-max-inflight-offloads"),
                    "a limit on fine-grained activation offload: every eligible tensor is modelled as offloaded"),
    "--ep-overlap-early-attn-memory-release": "attention's activations released early under EP overlap (peak memory)",
    "--overlap-dispatch-backward-with-experts-wgrad": "the experts' weight gradients on a stream of their own",
    **dict.fromkeys(("--high-priority-a2a-comm-stream", "--high-priority-stream-groups"), "CUDA stream priorities"),
    "--use-ring-exchange-p2p": "a custom ring_exchange kernel for pipeline P2P",
    **dict.fromkeys(("--symmetric-ar-type", "--disable-symmetric-registration"), "NCCL symmetric-memory all-reduce"),
    "--keep-fp8-transpose-cache": "Megatron-FSDP's fp8 transpose cache (memory)",
    **dict.fromkeys(("--mamba-training-ssm-states-dtype", "--disable-mamba-mem-eff-path"),
                    "Mamba's inter-chunk state dtype / its unfused path"),
    "--fp8-output-proj": "the LM head in MXFP8 (it is costed in BF16)",
    **dict.fromkeys(("--tensor-parallel-num-weight-shards", "--expert-tensor-parallel-num-weight-shards"),
                    "weights sharded past TP and re-gathered for each use"),
    **dict.fromkeys(("--glu-linear-offset", "--activation-func-clamp-value", "--use-fused-weighted-squared-relu"),
                    "an offset, clamp or fusion inside the MLP's activation (element-wise)"),
    "--apply-residual-connection-post-layernorm": "BERT's residual order (the residual taken after the norm)",
}


# flag, model field, Megatron-LM's default when the flag is left out (megatron/training/
# arguments.py), and the note that says so (none for the ones every GPT script leaves out)
# Muon options the step is costed at the default of (dp/muon.py): blockwise TP (each rank its
# shard), the "medium" fp32 matmul precision (bf16 tensor cores)
MUON_DEFAULT_ONLY = {"--muon-tp-mode": "blockwise", "--muon-fp32-matmul-prec": "medium"}

MEGATRON_DEFAULTS = (
    ("--normalization", "norm_type", "layernorm", "LayerNorm"),
    ("--position-embedding-type", "position_embedding_type", "learned_absolute", "learned_absolute"),
    ("--disable-bias-linear", "add_bias_linear", True, ""),
    ("--untie-embeddings-and-output-weights", "untie_embeddings_and_output_weights", False, ""),
)
