"""GPU specifications used by the cost model.

Every number comes from the vendor datasheet named in the ``source`` column.
Peak FLOPS are *dense* tensor-core throughput (no 2:4 sparsity); memory is
the capacity the driver reports (what vLLM's memory profiler starts from).

| key  | GPU            | memory    | HBM BW     | bf16 dense | fp8 dense  | source        |
|------|----------------|-----------|------------|------------|------------|---------------|
| h20  | H20 96GB       | 95.6 GiB  | 4.0 TB/s   | 148 TF     | 296 TF     | HGX H20 brief |
| h100 | H100 SXM5 80GB | 79.6 GiB  | 3.35 TB/s  | 989 TF     | 1979 TF    | H100 datasheet|
| h200 | H200 SXM 141GB | 140.4 GiB | 4.8 TB/s   | 989 TF     | 1979 TF    | H200 datasheet|
| a100 | A100 SXM4 80GB | 79.3 GiB  | 2.039 TB/s | 312 TF     | n/a (bf16) | A100 datasheet|
| l40s | L40S 48GB      | 44.5 GiB  | 0.864 TB/s | 362 TF     | 733 TF     | L40S datasheet|
| h800 | H800 SXM5 80GB | 79.6 GiB  | 3.35 TB/s  | 989 TF     | 1979 TF    | H800 datasheet|
| a800 | A800 SXM4 80GB | 79.3 GiB  | 2.039 TB/s | 312 TF     | n/a (bf16) | A800 datasheet|

Architectures: H20, H100, H200 and H800 are Hopper, A100 and A800 are Ampere, L40S is Ada.
H800 and A800 are the export versions of H100 and A100: the same chip, memory and tensor
throughput, with a narrower NVLink (400 GB/s), which a single-GPU instance never uses.
The cost model's efficiencies are fitted per architecture (calibration.json): vLLM runs
the same kernels on every part of one architecture, so H20, H200 and H800, which have no
usable vLLM measurement, take the efficiencies fitted on H100, and A800 those of A100.

Datasheets: NVIDIA's product pages/PDFs (SXM columns for H100/H200/A100-80GB).
Driver-reported capacities (nvidia-smi "Total" MiB): H20 97871, H100 81559,
H200 143771, A100-80GB 81251, L40S 46068, H800 and A800 as their sister parts
(approximate; they vary a little by driver and ECC setting).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024**2
GIB = 1024**3


@dataclass(frozen=True)
class GPUSpec:
    key: str
    name: str
    memory_bytes: int
    hbm_bandwidth: float  # bytes/s
    bf16_flops: float  # dense FLOP/s
    fp8_flops: float | None  # dense FLOP/s; None = no fp8 tensor cores
    source: str
    arch: str = "hopper"  # the architecture whose fitted efficiencies apply (costmodel)

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for the matmul dtype (fp8 falls back to bf16 without fp8 cores)."""
        if dtype == "fp8" and self.fp8_flops is not None:
            return self.fp8_flops
        return self.bf16_flops


GPUS: dict[str, GPUSpec] = {
    "h20": GPUSpec(
        "h20",
        "NVIDIA H20 96GB",
        97871 * MIB,
        4.0e12,
        148e12,
        296e12,
        "NVIDIA HGX H20 product brief",
    ),
    "h100": GPUSpec(
        "h100",
        "NVIDIA H100 SXM5 80GB",
        81559 * MIB,
        3.35e12,
        989e12,
        1979e12,
        "NVIDIA H100 Tensor Core GPU datasheet, SXM column",
    ),
    "h200": GPUSpec(
        "h200",
        "NVIDIA H200 SXM 141GB",
        143771 * MIB,
        4.8e12,
        989e12,
        1979e12,
        "NVIDIA H200 Tensor Core GPU datasheet, SXM column",
    ),
    "a100": GPUSpec(
        "a100",
        "NVIDIA A100 SXM4 80GB",
        81251 * MIB,
        2.039e12,
        312e12,
        None,
        "NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column",
        "ampere",
    ),
    "l40s": GPUSpec(
        "l40s",
        "NVIDIA L40S 48GB",
        46068 * MIB,
        0.864e12,
        362e12,
        733e12,
        "NVIDIA L40S datasheet (dense, without sparsity)",
        "ada",
    ),
    "h800": GPUSpec(
        "h800",
        "NVIDIA H800 SXM5 80GB",
        81559 * MIB,
        3.35e12,
        989e12,
        1979e12,
        "NVIDIA H800 Tensor Core GPU datasheet, SXM column",
    ),
    "a800": GPUSpec(
        "a800",
        "NVIDIA A800 SXM4 80GB",
        81251 * MIB,
        2.039e12,
        312e12,
        None,
        "NVIDIA A800 Tensor Core GPU datasheet, 80GB SXM column",
        "ampere",
    ),
}


def get_gpu(key: str) -> GPUSpec:
    try:
        return GPUS[key.lower()]
    except KeyError:
        raise KeyError(f"unknown GPU {key!r}; known: {sorted(GPUS)}") from None
