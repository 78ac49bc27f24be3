"""The benchmark's command line: bad options are refused with a message naming them."""

import pytest

from fp8quant.__main__ import build_parser


def test_negative_rotation_is_refused():
    args = build_parser().parse_args(["bench", "--rotation-mib", "-1"])
    with pytest.raises(SystemExit, match=r"^--rotation-mib must be >= 0, got -1$"):
        args.run(args)


def test_unknown_dtype_is_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--dtype", "int8"])
    assert "--dtype" in capsys.readouterr().err
