"""Lines every healthy training job prints. No failure signature may match any of them.

Used to check admin-edited patterns before they are accepted (a pattern that fires on NCCL
chatter or on progress lines would stop healthy jobs), by the tests of the built-in
signatures, and by the benchmark's generated log.
"""

from __future__ import annotations

HEALTHY_LINES: tuple[str, ...] = (
    "gpu-a100-001:4242:4242 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.1<0>",
    "gpu-a100-001:4242:4290 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.0.1<0>",
    "gpu-a100-001:4242:4290 [0] NCCL INFO Channel 00/32 : 0 -> 1 via P2P/IPC/read",
    "gpu-a100-001:4242:4290 [0] NCCL INFO comm 0x55c1e2a0 rank 0 nranks 16 cudaDev 0 busId 1b000 - Init COMPLETE",
    "gpu-a100-001:4242:4242 [0] NCCL WARN NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation",
    "misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
    "NCCL version 2.21.5+cuda12.4",
    " iteration      122/  250000 | consumed samples:       124928 | elapsed time per iteration (ms): 86545.2 | learning rate: 9.150E-06 | global batch size:  1024 | lm loss: 2.504220E+00 | loss scale: 1.0 | grad norm: 0.231 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    "Training epoch 0, iteration 3/9 | lr: 0.0006 | consumed_samples: 128 | global_batch_size: 32 | global_step: 3 | reduced_train_loss: 8.595",
    "Epoch 10:  93%|█████████▎| 18625/20000 [5:43:21<25:20,  0.90it/s, v_num=0txx, train_loss=3.400]",
    "{'loss': 1.2345, 'grad_norm': 0.5, 'learning_rate': 4.9e-05, 'epoch': 0.01}",
    "[2026-11-29 10:01:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]",
    "step:  10  loss:  9.8  memory: 30.12GiB(38.09%)  tps: 5,231  tflops: 120.3  mfu: 38.2%",
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
    "successfully saved checkpoint from iteration    2000 to /ckpt/llama",
    "Saving model checkpoint to /out/checkpoint-500",
    "/opt/conda/lib/python3.10/site-packages/torch/utils/checkpoint.py:460: UserWarning: torch.utils.checkpoint: please pass in use_reentrant=True or use_reentrant=False explicitly.",
    "FutureWarning: The module torch.distributed.launch is deprecated and will be removed in future. Use torchrun.",
    "[W ProcessGroupNCCL.cpp:1856] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS=1 has no effect (function operator())",
    "wandb: Tracking run with wandb version 0.16.6",
    "Loading checkpoint shards: 100%|██████████| 4/4 [00:05<00:00,  1.31s/it]",
    "[before the start of training step] datetime: 2026-11-29 01:59:29",
    "srun: job 48213 queued and waiting for resources",
    "pcieport 0000:00:03.0: AER: Corrected error received: 0000:00:03.0",
    "",
)
