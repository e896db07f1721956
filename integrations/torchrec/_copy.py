"""Path-preserving copies of a module tree that share everything they do not replace."""

from __future__ import annotations

import copy

from torch import nn

__all__ = ["copy_paths", "shallow_copy"]


def shallow_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` sharing its parameters, buffers and children, with its own dicts.

    Its ``_modules``, hook and parameter dicts are copies, so replacing a child
    or installing a hook on the copy leaves the original untouched.
    """
    new = copy.copy(module)
    for key, value in list(vars(new).items()):
        if isinstance(value, (dict, set)):
            new.__dict__[key] = copy.copy(value)
    return new


def copy_paths(root: nn.Module, parents: list[str]) -> nn.Module:
    """``root`` with every module on the way to each of ``parents`` shallow-copied."""
    new_root = shallow_copy(root)
    copies: dict[str, nn.Module] = {"": new_root}
    for path in parents:
        current, prefix = new_root, ""
        for part in path.split(".") if path else []:
            prefix = f"{prefix}.{part}" if prefix else part
            if prefix not in copies:
                copies[prefix] = shallow_copy(current._modules[part])  # type: ignore[arg-type]
                current._modules[part] = copies[prefix]
            current = copies[prefix]
    return new_root
