"""The names of the values whose type is arbitrary by nature: where the package writes ``Any``, it says which.

Every other annotation in the package names a type. An annotation that is ``Any`` itself is one
of the aliases below, so that a reader sees what the value is and why nothing narrower holds
(``tests/test_house.py`` checks that no bare ``Any`` annotation is left). mypy treats each alias
as ``Any``: they document, they do not check.
"""

from __future__ import annotations

from typing import Any, TypeAlias

#: A value of the user's model or data: a batch, a module's positional or keyword arguments, its
#: outputs, a leaf of any of them, or a pytree of them (tensors, numbers, strings, dataclasses,
#: ``KeyedJaggedTensor``s, ``None`` …). The profiler walks, copies and moves such values and
#: never assumes what they are.
UserValue: TypeAlias = Any

#: An ATen operator's argument or result as ``__torch_dispatch__`` sees it: tensors, numbers,
#: dtypes, devices, lists of them, ``None`` — whatever the operator's schema takes or returns.
OpValue: TypeAlias = Any

#: A configuration option's value as the caller passed it (``BenchmarkConfig``'s options, a
#: plugin's settings, an override); the receiving dataclass checks each one by its name.
OptionValue: TypeAlias = Any

#: A picklable value one rank sends the others through the ``Coordinator`` (a plan, a check's
#: dict, a row's numbers, an error): what comes back is whatever the caller sent, of the caller's
#: type, which the caller knows and the exchange does not.
RankValue: TypeAlias = Any
