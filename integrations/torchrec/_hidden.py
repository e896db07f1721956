"""Finding fbgemm TBEs in a module tree, including those kept outside it (plain attributes)."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

__all__ = ["hidden_modules", "tbe_classes", "tbe_modules"]


def tbe_classes() -> tuple[type, ...]:
    """fbgemm's training TBE classes that are importable."""
    classes: list[type] = []
    try:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        classes.append(SplitTableBatchedEmbeddingBagsCodegen)
    except ImportError:  # pragma: no cover - fbgemm without training ops
        pass
    try:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            DenseTableBatchedEmbeddingBagsCodegen,
        )

        classes.append(DenseTableBatchedEmbeddingBagsCodegen)
    except ImportError:  # pragma: no cover
        pass
    return tuple(classes)


def _attr_modules(mod: nn.Module) -> Iterator[nn.Module]:
    """Modules held in ``mod``'s plain attributes (a module, or a list/tuple/dict of them)."""
    for key, value in vars(mod).items():
        if key in ("_modules", "_parameters", "_buffers"):
            continue
        if isinstance(value, nn.Module):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, nn.Module))
        elif isinstance(value, dict):
            yield from (v for v in value.values() if isinstance(v, nn.Module))


def hidden_modules(root: nn.Module) -> Iterator[nn.Module]:
    """Modules reachable from plain attributes of ``root``'s tree but not registered in it."""
    in_tree = {id(m) for m in root.modules()}
    seen: set[int] = set()
    stack = list(root.modules())
    while stack:
        mod = stack.pop()
        for cand in _attr_modules(mod):
            for sub in cand.modules():
                if id(sub) in in_tree or id(sub) in seen:
                    continue
                seen.add(id(sub))
                stack.append(sub)
                yield sub


def tbe_modules(root: nn.Module) -> list[nn.Module]:
    """Every TBE under ``root``, registered or hidden in plain attributes."""
    classes = tbe_classes()
    if not classes:
        return []
    mods = list(root.modules()) + list(hidden_modules(root))
    return [m for m in mods if isinstance(m, classes)]
