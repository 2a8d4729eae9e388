"""What every config section is built from: :class:`Model` (frozen, ``extra="forbid"``,
so a misspelt key is an error, never a silent default) and the shared field types,
among them :data:`RelPath`, a path that resolves against the folder of the config
file (passed as validation context ``base_dir``) when it is relative.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo


def _resolve(value: Path, info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base_dir")
    if value.is_absolute() or base is None:
        return value
    return Path(base) / value


RelPath = Annotated[Path, AfterValidator(_resolve)]
PositiveFloat = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]
Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Model(BaseModel):
    # validate_default: defaulted paths are resolved against the config folder too.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
