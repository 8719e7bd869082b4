"""A tool from an ordinary typed function (docs/tools.md, "Typed tools"), driven by a
scripted model (examples/shout.json): the first call runs, the second has a wrong-typed
argument and the model is told why. Run: python examples/typed_tool.py"""

from pathlib import Path

from tether import Agent, load_model, tool


@tool
def shout(text: str) -> str:
    """Shout a text back.

    Args:
        text: What to shout.
    """
    return text.upper() + "!"


script = Path(__file__).resolve().parent / "shout.json"
with Agent(load_model(f"scripted:{script}"), [shout], workspace=".") as agent:
    result = agent.run("shout hi")
schema = shout.definition()["parameters"]
print(schema["required"], schema["properties"]["text"]["type"])  # ['text'] string
print(schema["properties"]["text"]["description"])  # What to shout.
print(result.status, result.text)  # completed Shouted.
