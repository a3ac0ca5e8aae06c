"""No import runs up the layers: memllm_jax never imports data_gen, experiments or tests, and within memllm_jax a
module imports only its own layer or lower ones (imports inside functions included)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]

LAYERS = (
    {"memllm_jax", "errors", "protocol", "files", "options", "settings", "config", "runtime", "sharding", "docred",
     "html", "compilation_cache"},
    {"model", "checkpoint", "tokenizer"},  # the tokenizer reads a model's directory or .gguf file (model.gguf)
    {"memory"},
    {"decode"},
    {"train"},
    {"eval"},
    {"bench"},
    {"cli", "plan_cli"},
)
"""Low to high. A top-level module or a package of memllm_jax is one unit: `memllm_jax.X`'s unit is X."""
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
OUTSIDE = ("data_gen", "experiments", "tests")


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, node.lineno
            if node.module == "memllm_jax":  # `from memllm_jax import protocol`
                yield from ((f"memllm_jax.{alias.name}", node.lineno) for alias in node.names)


def test_every_module_has_a_layer():
    units = {path.stem if path.suffix else path.name for path in (ROOT / "memllm_jax").iterdir()
             if path.suffix == ".py" or (path / "__init__.py").exists()}
    missing = sorted(units - set(RANK) - {"__init__"})
    assert not missing, f"give these a layer in LAYERS: {missing}"


def test_no_import_runs_up_the_layers():
    bad = []
    for path in sorted((ROOT / "memllm_jax").rglob("*.py")):
        rel = path.relative_to(ROOT)
        parts = rel.with_suffix("").parts
        own = RANK[parts[1] if len(parts) > 1 and parts[1] != "__init__" else "memllm_jax"]
        for module, line in _imports(ast.parse(path.read_text(), str(rel))):
            top = module.split(".")[0]
            if top in OUTSIDE:
                bad.append(f"{rel}:{line}: imports {module}")
            elif top == "memllm_jax" and module != "memllm_jax" and RANK[_unit(module)] > own:
                bad.append(f"{rel}:{line}: imports {module} (layer {RANK[_unit(module)]} > {own})")
    assert not bad, "imports running up the layers:\n" + "\n".join(bad)
