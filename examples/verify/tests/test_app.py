import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from app import add  # noqa: E402


def test_add() -> None:
    assert add(2, 3) == 5
