"""README.md, "Running an agent": run from a folder holding README.md and examples/
(the repository's root does): python examples/run_agent.py"""

from tether import Agent, builtin_tools, load_model
from tether.testing import PublishReportTool  # the demo effect tool

with Agent(                                     # holds its session until closed
    load_model("scripted:examples/publish.json"),  # or a model id: "openai/gpt-4o-mini"
    [*builtin_tools(), PublishReportTool.for_workspace(".")],
    workspace=".",
    durability="durable",                      # fdatasync every commit (default)
    on_event=lambda event: print(event.to_json()),
) as agent:
    result = agent.run("summarise README.md and publish it")
    print(result.status, result.text, result.usage)  # completed … Usage(…)
    # After a crash (any process): continue exactly as the log says.
    result = agent.resume(result.session_id)
    agent.compact(result.session_id)            # compaction is its own durable operation
    agent.abort()                               # thread-safe, e.g. from a signal handler
