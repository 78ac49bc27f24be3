"""The benchmark's command line (bad options are refused with a message naming them) and report."""

import pytest
import torch

from fp8quant import bench
from fp8quant.__main__ import build_parser


def test_negative_rotation_is_refused():
    args = build_parser().parse_args(["bench", "--rotation-mib", "-1"])
    with pytest.raises(SystemExit, match=r"^--rotation-mib must be >= 0, got -1$"):
        args.run(args)


def test_unknown_dtype_is_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--dtype", "int8"])
    assert "--dtype" in capsys.readouterr().err


def test_unknown_format_is_refused():
    args = build_parser().parse_args(["bench", "--formats", "row,col"])
    with pytest.raises(SystemExit, match=r"^--formats: 'col' is not one of row, row\+ue8m0, mn, "):
        args.run(args)


def test_bad_m_is_refused():
    args = build_parser().parse_args(["bench", "--m", "128,x"])
    with pytest.raises(SystemExit, match=r"^--m: cannot read 'x'$"):
        args.run(args)
    args = build_parser().parse_args(["bench", "--m", "0"])
    with pytest.raises(SystemExit, match=r"^--m: M must be >= 1, got 0$"):
        args.run(args)


def test_k_must_hold_whole_groups():
    args = build_parser().parse_args(["bench", "--m", "4", "--k", "100"])
    with pytest.raises(SystemExit, match=r"^--k must be a positive multiple of --group-size \(128\), got 100$"):
        args.run(args)


def test_m_picks_the_shapes():
    assert bench.bench_shapes(False, [1, 4096], 2048) == [(1, 2048), (4096, 2048)]
    assert bench.bench_shapes(True)[0] == (1, bench.K_MAIN)


def test_method_names_the_buffers_it_timed():
    assert "at least 256 MiB in all" in bench.method_text(256)
    l2 = bench.method_text(0)
    assert "one buffer set" in l2 and "L2" in l2 and "MiB" not in l2


def test_host_overhead_needs_a_gpu():
    args = build_parser().parse_args(["bench", "--host-overhead"])
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the GPU suite runs the host-overhead mode")
    with pytest.raises(SystemExit, match=r"^--host-overhead times eager calls on a CUDA GPU; none was found$"):
        args.run(args)


def test_report_names_its_op_rows_and_granularity():
    """The weights bench reports N rows and 128 x 128 blocks; the default stays the quantizer's."""
    weights = bench.Report("GPU", "bf16", 128, "method", 4000.0, op="per_block_quant", rows="N",
                           granularity="128 x 128 blocks")  # fmt: skip
    weights.results.append(bench.Result(4096, 7168, "per_block_quant", 20.0, 88_080_384, 2, 100))
    assert weights.table().split("\n")[0].split()[:2] == ["N", "K"]
    md = weights.markdown()
    assert md.startswith("### per_block_quant: GPU, bf16 input, 128 x 128 blocks\n") and "| N | K |" in md
    default = bench.Report("GPU", "bf16", 64, "method", 4000.0)
    default.results.append(bench.Result(1, 7168, "row", 1.0, 100, 1, 1))
    assert default.markdown().startswith("### per_token_group_quant: GPU, bf16 input, group size 64\n")
    assert "| M | K |" in default.markdown()


def test_weights_mode_needs_a_gpu():
    args = build_parser().parse_args(["bench", "--weights"])
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the weights bench runs there")
    with pytest.raises(SystemExit, match=r"^--weights times the GPU kernel; no CUDA GPU was found$"):
        args.run(args)


def test_moe_mode_needs_a_gpu():
    args = build_parser().parse_args(["bench", "--moe"])
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the MoE bench runs there")
    with pytest.raises(SystemExit, match=r"^--moe times the GPU kernels; no CUDA GPU was found$"):
        args.run(args)


def test_norm_mode_needs_a_gpu():
    args = build_parser().parse_args(["bench", "--norm"])
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the norm bench runs there")
    with pytest.raises(SystemExit, match=r"^--norm times the GPU kernels; no CUDA GPU was found$"):
        args.run(args)
