"""The kernels ``tune-model`` tunes are shipped with the package: they resolve by module name from the installed
packages (``search_spaces``, listed by setup.cfg), not from the checkout's examples."""

from __future__ import annotations

import configparser
import importlib.util
from pathlib import Path

import pytest
from setuptools import find_namespace_packages

from evotune.model.plan import Family
from evotune.model.tuning import SOURCES

ROOT = Path(__file__).resolve().parents[1]


def _shipped_packages() -> set[str]:
    """The packages a wheel built from setup.cfg holds (its ``[options.packages.find] include``)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    include = [line.strip() for line in cfg["options.packages.find"]["include"].splitlines() if line.strip()]
    return set(find_namespace_packages(where=str(ROOT), include=include))


@pytest.mark.parametrize("family", [Family.FUSED_MOE, Family.GEMM])
def test_each_kernel_and_its_space_resolve_inside_a_shipped_package(family) -> None:
    source = SOURCES[family]
    shipped = _shipped_packages()
    for ref in (source.ref, source.space):
        assert ref is not None
        module = ref.rpartition(":")[0]
        assert not module.endswith(".py"), f"{ref}: a file path, not a module an installed evotune can import"
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None
        package = module.rpartition(".")[0]
        assert package in shipped, f"{module}: its package {package} is not in setup.cfg's packages"
        assert Path(spec.origin).parent == ROOT.joinpath(*package.split("."))
        assert "examples" not in Path(spec.origin).relative_to(ROOT).parts


@pytest.mark.parametrize("family", [Family.FUSED_MOE, Family.GEMM])
def test_each_kernel_loads_as_tune_kernel_loads_it(family) -> None:
    pytest.importorskip("triton")
    from evotune.triton_tuning.references import load_kernel

    source = SOURCES[family]
    kernel, module = load_kernel(source.ref, source.space, source.key)
    assert kernel.keys == (source.key or "").split(",")
    assert Path(module.__file__).parent == ROOT / "search_spaces"
