"""The benchmark's command line (bad options, and options the chosen mode does not take, are
refused with a message naming them; modes are exclusive; --help matches the code), its CPU run,
its report, and the structure of the eager call the host-overhead mode times."""

import json
import re

import pytest
import torch

import fp8quant
from fp8quant import bench
from fp8quant.__main__ import build_parser
from fp8quant.bench import quant as bench_quant
from fp8quant.bench import timing


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
    assert timing.bench_shapes(False, [1, 4096], 2048) == [(1, 2048), (4096, 2048)]
    assert timing.bench_shapes(True)[0] == (1, timing.K_MAIN)


def test_method_names_the_buffers_it_timed():
    assert "at least 256 MiB in all" in timing.method_text(256)
    l2 = timing.method_text(0)
    assert "one buffer set" in l2 and "L2" in l2 and "MiB" not in l2


@pytest.mark.parametrize(
    "mode,message",
    [
        ("--host-overhead", "--host-overhead times eager calls on a CUDA GPU; none was found"),
        ("--weights", "--weights times the GPU kernel; no CUDA GPU was found"),
        ("--moe", "--moe times the GPU kernels; no CUDA GPU was found"),
        ("--norm", "--norm times the GPU kernels; no CUDA GPU was found"),
        ("--mx", "--mx times the GPU kernels; no CUDA GPU was found"),
    ],
)
def test_gpu_modes_need_a_gpu(mode, message):
    args = build_parser().parse_args(["bench", mode])
    if torch.cuda.is_available():
        pytest.skip(f"a GPU is present: the GPU suite runs {mode}")
    with pytest.raises(SystemExit, match=f"^{re.escape(message)}$"):
        args.run(args)


def test_report_names_its_op_rows_and_granularity():
    """The weights bench reports N rows and 128 x 128 blocks; the default stays the quantizer's."""
    weights = timing.Report("GPU", "bf16", 128, "method", 4000.0, op="per_block_quant", rows="N",
                           granularity="128 x 128 blocks")  # fmt: skip
    weights.results.append(timing.Result(4096, 7168, "per_block_quant", 20.0, 88_080_384, 2, 100))
    assert weights.table().split("\n")[0].split()[:2] == ["N", "K"]
    md = weights.markdown()
    assert md.startswith("### per_block_quant: GPU, bf16 input, 128 x 128 blocks\n") and "| N | K |" in md
    default = timing.Report("GPU", "bf16", 64, "method", 4000.0)
    default.results.append(timing.Result(1, 7168, "row", 1.0, 100, 1, 1))
    assert default.markdown().startswith("### per_token_group_quant: GPU, bf16 input, group size 64\n")
    assert "| M | K |" in default.markdown()


# --- modes and their options -----------------------------------------------------------------------


def test_modes_are_exclusive(capsys):
    for pair in (["--moe", "--norm"], ["--weights", "--host-overhead"], ["--gemm", "--moe"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", *pair])
        assert f"argument {pair[1]}: not allowed with argument {pair[0]}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--gemm", "--k", "4096"], r"^--k does not apply to --gemm, which takes --m \(and --json, --markdown\)$"),
        (["--moe", "--formats", "row"], r"^--formats does not apply to --moe, which takes --m, --k, --rotation-mib "),
        (["--moe", "--dtype", "fp16"], r"^--dtype does not apply to --moe"),
        (["--norm", "--group-size", "64"], r"^--group-size does not apply to --norm"),
        (["--host-overhead", "--quick"], r"^--quick does not apply to --host-overhead"),
        (["--weights", "--baselines", "all"], r"^--baselines does not apply to --weights"),
        (["--host-overhead", "--m", "1,2"], r"^--host-overhead times one M, got --m 1,2$"),
        (["--host-overhead", "--formats", "row,mn"], r"^--host-overhead times one scale layout: --formats takes one "),
        (["--host-overhead", "--formats", "row+ue8m0"], r"^--host-overhead times one scale layout"),
    ],
)
def test_options_a_mode_does_not_take_are_refused(argv, message):
    """Refused before anything runs (GPU or not): no option is silently ignored."""
    args = build_parser().parse_args(["bench", *argv])
    with pytest.raises(SystemExit, match=message):
        args.run(args)


def test_norm_takes_16_bit_input():
    args = build_parser().parse_args(["bench", "--norm", "--dtype", "fp32"])
    with pytest.raises(SystemExit, match=r"^--norm times bf16 or fp16 input"):
        args.run(args)


def test_help_describes_every_mode_and_option():
    """--help names every mode and option, and its table of the options each mode takes is
    bench.MODE_OPTIONS, the table main() enforces."""
    parser = build_parser()
    bench_parser = parser._subparsers._group_actions[0].choices["bench"]
    text = bench_parser.format_help()
    flags = {f for action in bench_parser._actions for f in action.option_strings} - {"-h", "--help"}
    modes = {bench.flag(mode) for mode in bench.MODE_OPTIONS if mode is not None}
    assert flags == modes | {bench.flag(o) for o in bench.OPTIONS} | {"--json", "--markdown"}
    for f in flags:
        assert f in text
    table = text[text.index("options each mode takes") :].splitlines()[1:]
    rows = {line.split()[0]: line.split()[1:] for line in table if not line.startswith("  (default, no GPU)")}
    assert rows == {bench.flag(mode): [bench.flag(o) for o in opts] for mode, opts in bench.MODE_OPTIONS.items()}
    assert "--weights" in text.split("One mode a run:")[1]  # the description lists the modes


def test_k_alone_keeps_the_default_m():
    assert timing.bench_shapes(False, None, 2048) == [(m, 2048) for m in timing.M_MAIN]
    assert timing.bench_shapes(True, None, 2048) == [(m, 2048) for m in timing.M_QUICK]
    assert bench_quant.cpu_shapes(True) == [(m, timing.K_MAIN) for m in bench_quant.M_CPU_QUICK]
    assert bench_quant.cpu_shapes(False, [3], 256) == [(3, 256)]
    from fp8quant.bench.weights import SHAPES, weight_shapes  # noqa: PLC0415

    assert weight_shapes() == list(SHAPES) and weight_shapes([256], None) == [(256, timing.K_MAIN)]
    assert weight_shapes(None, 4096) == [(4096, 4096), (7168, 4096), (18432, 4096), (24576, 4096), (32768, 4096)]


def cpu_report(tmp_path, *argv):
    """Run the default mode without a GPU (the CPU reference) and read its JSON report."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the default mode times the kernels there")
    path = tmp_path / "bench.json"
    args = build_parser().parse_args(["bench", *argv, "--json", str(path)])
    assert args.run(args) == 0
    return json.loads(path.read_text())


def test_cpu_run_takes_m_k_and_formats(tmp_path):
    report = cpu_report(tmp_path, "--m", "2,3", "--k", "256", "--formats", "mn,packed_ue8m0", "--group-size", "64")
    assert [(r["m"], r["k"], r["name"]) for r in report["results"]] == [
        (2, 256, "mn"), (2, 256, "packed_ue8m0"), (3, 256, "mn"), (3, 256, "packed_ue8m0"),
    ]  # fmt: skip
    assert report["device"] == "CPU" and report["group_size"] == 64


def test_cpu_run_takes_quick(tmp_path):
    report = cpu_report(tmp_path, "--quick", "--k", "256")
    assert [(r["m"], r["k"], r["name"]) for r in report["results"]] == [
        (m, 256, name) for m in bench_quant.M_CPU_QUICK for name in bench_quant.LAYOUTS_CPU
    ]


def test_model_runs_tiny_dims_on_the_cpu(tmp_path):
    """--model without a GPU: tiny dims, eager, every row and the accuracy line in the report."""
    pytest.importorskip("transformers")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: --model builds the real dims there")
    path = tmp_path / "model.json"
    args = build_parser().parse_args(["bench", "--model", "qwen3-moe", "--quick", "--m", "16,32", "--json", str(path)])
    assert args.run(args) == 0
    report = json.loads(path.read_text())
    assert report["device"] == "CPU (tiny dims)" and report["layers"] == 2
    assert [r["measurement"] for r in report["results"]] == ["prefill T=16", "prefill T=32", "decode step, batch 1"]
    assert all(r["bf16_ms"] > 0 and r["fp8quant_ms"] > 0 for r in report["results"])
    assert 0 < report["calc_diff"]["fp8quant"] <= 1.1 * report["calc_diff"]["floor"]
    for layers in ("1", "0"):
        args = build_parser().parse_args(["bench", "--model", "deepseek-v3", "--layers", layers])
        with pytest.raises(
            SystemExit, match=rf"^--layers must be >= 2 \(the first layer is dense, the others MoE\), got {layers}$"
        ):
            args.run(args)


def test_gpu_options_are_refused_on_the_cpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the options apply")
    for option, value in (("--baselines", "all"), ("--rotation-mib", "0")):
        args = build_parser().parse_args(["bench", option, value])
        with pytest.raises(SystemExit, match=rf"^{option} applies to the GPU run; no CUDA GPU was found, and the CPU"):
            args.run(args)


# --- the eager path --host-overhead times, checked by structure (also on the CPU) ------------------


def test_eager_call_is_direct(monkeypatch):
    """An eager call on plain tensors takes the direct path: no fp8quant:: op through torch's
    dispatcher (a round trip costs more host time than the kernel takes), nothing allocated but
    its outputs, nothing at all with out=. On the CPU the reference is the op's work, so it is
    stubbed; what remains is the path a CUDA call takes before its launch. The registered op is
    the control. (The GPU suite checks the same on CUDA tensors, CUDA allocations included.)"""
    from gpu_harness import assert_direct_eager_call  # noqa: PLC0415

    from fp8quant.norm import _add_norm_quant  # noqa: PLC0415
    from fp8quant.quant import _quant  # noqa: PLC0415

    for op in (_quant, _add_norm_quant):
        monkeypatch.setattr(op, "_run", lambda *args: None)
    x = torch.randn(5, 7168).to(torch.bfloat16)
    assert_direct_eager_call(lambda: fp8quant.per_token_group_quant(x, 128, scale_layout="mn_tma"), 2)
    q, s = fp8quant.per_token_group_quant(x, 128, scale_layout="mn_tma")
    assert_direct_eager_call(lambda: fp8quant.per_token_group_quant(x, 128, scale_layout="mn_tma", out=(q, s)), 0)
    w, residual = torch.ones(7168, dtype=torch.bfloat16), torch.randn(5, 7168).to(torch.bfloat16)
    assert_direct_eager_call(lambda: fp8quant.rms_norm_quant(x, w, 1e-6, residual=residual, scale_layout="mn_tma"), 2)
    with pytest.raises(AssertionError, match=r"went through the dispatcher: \['fp8quant::per_token_group_quant'\]"):
        assert_direct_eager_call(lambda: torch.ops.fp8quant.per_token_group_quant(x, 128, "mn_tma", False, 1e-10), 2)
