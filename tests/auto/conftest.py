import pytest
import yaml

from auto_helpers import BASE, program_text


@pytest.fixture
def write_program(tmp_path):
    def write(**over):
        p = tmp_path / "program.md"
        p.write_text(program_text(**over))
        b = tmp_path / "base.yaml"
        b.write_text(yaml.safe_dump(BASE))
        return p, b
    return write
