"""The ``twist hermes-acp`` plugin. Lazy: names a module, imports nothing of ours."""

from twisted.application.service import ServiceMaker

hermesACP = ServiceMaker(
    "hermes-acp",
    "hermes_acp.tap",
    "Agent Client Protocol agent over stdio (for code editors)",
    "hermes-acp",
)
