"""The agent engine: no Jupyter, no pandas — just the loop, recovery and the façade."""

from .agent import We0Agent
from .recovery import RecoveryPlan, ToolAction, needs_recovery, plan_recovery
from .request import RunRequest, RunResult, UserInput, build_request, user_message

__all__ = ["We0Agent", "RunRequest", "RunResult", "UserInput", "user_message", "build_request",
           "RecoveryPlan", "ToolAction", "plan_recovery", "needs_recovery"]
