"""Tools: the contract (:mod:`.base`), confinement (:mod:`.workspace`), the built-ins."""

from tether._tools.base import (
    FunctionTool,
    RecoveryKind,
    Rejection,
    Tool,
    ToolContext,
    ToolRegistry,
    ToolResult,
    ValidatedCall,
)
from tether._tools.builtin import (
    BashTool,
    EditTool,
    FileChange,
    FileChangeTool,
    PlannedChange,
    ReadTool,
    WriteTool,
    apply_change,
    builtin_tools,
    plan_edit,
    plan_write,
)
from tether._tools.decorator import tool
from tether._tools.workspace import resolve_in_workspace

__all__ = [
    "BashTool",
    "EditTool",
    "FileChange",
    "FileChangeTool",
    "FunctionTool",
    "PlannedChange",
    "ReadTool",
    "RecoveryKind",
    "Rejection",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "ValidatedCall",
    "WriteTool",
    "apply_change",
    "builtin_tools",
    "plan_edit",
    "plan_write",
    "resolve_in_workspace",
    "tool",
]
