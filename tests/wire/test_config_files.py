"""The shared config-file layer (servelab.wire.config): strict base models, YAML reading, one-line
validation errors, published JSON Schemas and the `servelab schema write|check` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Discriminator, Field, ValidationError

from servelab.wire.config import FrozenModel, PublishedSchema, StrictModel, read_yaml_file, validation_error_line
from servelab.wire.errors import ConfigError


class Leaf(StrictModel):
    port: int = Field(8080, ge=1)
    name: str = Field("x", pattern=r"^[a-z]+$")


class Cat(StrictModel):
    kind: Literal["cat"]
    lives: int = 9


class Dog(StrictModel):
    kind: Literal["dog"]
    bark: bool = True


class Root(StrictModel):
    server: Leaf = Leaf()
    backends: list[Leaf] = []
    pets: list[Annotated[Cat | Dog, Discriminator("kind")]] = []


def line(data: object, **kw: object) -> str:
    with pytest.raises(ValidationError) as e:
        Root.model_validate(data)
    return validation_error_line(e.value, "f.yaml", Root, **kw)  # type: ignore[arg-type]


def test_unknown_field_gets_the_nearest_name_and_the_path() -> None:
    assert line({"server": {"prot": 1}}) == "f.yaml: server.prot: unknown field (did you mean 'port'?)"
    assert line({"backends": [{}, {"zzz": 1}]}) == "f.yaml: backends[1].zzz: unknown field (valid: port, name)"


def test_discriminated_union_paths_drop_the_tag_and_list_the_choices() -> None:
    assert (
        line({"pets": [{"kind": "cat", "lifes": 3}]}) == "f.yaml: pets[0].lifes: unknown field (did you mean 'lives'?)"
    )
    assert (
        line({"pets": [{"kind": "dgo"}]}) == "f.yaml: pets[0].kind: 'dgo' is not one of cat, dog (did you mean 'dog'?)"
    )
    assert line({"pets": [{}]}) == "f.yaml: pets[0].kind: required field is missing; use one of cat, dog"


def test_bounds_patterns_hints_and_more_count() -> None:
    assert (
        line({"server": {"port": 0, "name": "A"}})
        == "f.yaml: server.port: input should be greater than or equal to 1, got 0 (+1 more)"
    )
    got = line({"server": {"name": "A"}}, pattern_hints={r"^[a-z]+$": "use lower-case letters"})
    assert got == "f.yaml: server.name: 'A' does not match ^[a-z]+$; use lower-case letters"
    assert line({"backends": 5}) == "f.yaml: backends: expected a list, got int 5"


def test_frozen_model_is_immutable_and_strict_forbids_extras() -> None:
    class Snap(FrozenModel):
        a: int = 1

    s = Snap()
    with pytest.raises(ValidationError):
        s.a = 2
    with pytest.raises(ValidationError, match="Extra inputs"):
        Snap.model_validate({"b": 1})


@pytest.mark.parametrize(
    "text,needle",
    [
        ("", "the file is empty; write one"),
        ("a: [1,\n", "line 2 column 1: invalid YAML"),
        (b"\xff\xfe", "cannot read as UTF-8 text"),
    ],
)
def test_read_yaml_file_one_line_errors(tmp_path: Path, text: str | bytes, needle: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as e:
        read_yaml_file(p, what="thing", missing_fix="give one", empty_fix="write one")
    assert needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="no such thing file; give one"):
        read_yaml_file(tmp_path / "nope.yaml", what="thing", missing_fix="give one", empty_fix="write one")


def test_published_schema_write_and_check(tmp_path: Path) -> None:
    s = PublishedSchema(tmp_path / "root.schema.json", lambda: Root.model_json_schema(), regenerate="do it")
    assert s.problem() == f"{s.path}: missing; run `do it`"
    assert s.write() == s.path and s.problem() is None
    assert json.loads(s.path.read_text()) == Root.model_json_schema()
    s.path.write_text(s.path.read_text().replace('"port"', '"prot"'))
    assert s.problem() == f"{s.path}: out of date with its models; run `do it`"


def _servelab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_schema_command_writes_what_check_compares(tmp_path: Path) -> None:
    from servelab.cli import published_schemas

    r = _servelab("schema", "write", "--dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(s.path.name for s in published_schemas())
    assert {
        "experiment.schema.json",
        "gateway.schema.json",
        "engines.schema.json",
        "hardware.schema.json",
        "models.schema.json",
        "summary.schema.json",
        "record.schema.json",
        "traffic.schema.json",
    } == set(names)
    for s in published_schemas():  # the files written are the ones `check` wants committed
        assert (tmp_path / s.path.name).read_text(encoding="utf-8") == s.text()
    r = _servelab("schema", "check")
    stale = [s for s in published_schemas() if s.problem()]
    assert r.returncode == (1 if stale else 0)
    assert r.stderr.count("\n") == len(stale) and "Traceback" not in r.stderr


def test_schema_write_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    r = _servelab("schema", "write", "--dir", str(tmp_path / "nope"))
    assert (
        r.returncode == 2
        and r.stderr.strip() == f"servelab: error: --dir {tmp_path / 'nope'}: no such folder; create it first"
    )
