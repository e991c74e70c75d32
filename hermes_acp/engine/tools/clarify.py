"""``clarify``: the model asks the user a question, under Hermes' name, arguments and
result (``{question, choices_offered, user_response}``).

The engine only asks (``ToolContext.askUser``, bound to the call); how the question
reaches the user is the ACP layer's choice. Its answer is an ``engine.asking.Answer``:
what the user did, told to the model in plain words.
"""

from __future__ import annotations

from hermes_acp.engine.asking import ACCEPTED, CANCELLED, DECLINED, DEFERRED, Answer
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters

MAX_CHOICES = 4
MAX_QUESTION_CHARS = 4000
MAX_CHOICE_CHARS = 200


def checkedChoices(choices: list[object] | None) -> list[str]:
    if not choices:
        return []
    if len(choices) > MAX_CHOICES:
        raise ToolError(f"choices: at most {MAX_CHOICES}; the user can always type an answer of their own")
    checked: list[str] = []
    for position, choice in enumerate(choices):
        if not isinstance(choice, str) or not choice.strip():
            raise ToolError(f"choices[{position}] must be a non-empty string")
        choice = " ".join(choice.split())
        if len(choice) > MAX_CHOICE_CHARS:
            raise ToolError(f"choices[{position}] is longer than {MAX_CHOICE_CHARS} characters; keep choices short")
        if choice in checked:
            raise ToolError(f"choices[{position}] repeats {choice!r}")
        checked.append(choice)
    return checked


def userResponse(answer: Answer) -> str | None:
    """What the model reads of the user's answer, in plain words."""
    if answer.action == ACCEPTED:
        return answer.text
    if answer.action == DECLINED:
        return "[the user declined to answer]"
    if answer.action == CANCELLED:
        return "[the user dismissed the question without answering]"
    if answer.action == DEFERRED:
        return None
    return f"[no answer: {answer.text or 'the user could not be asked'}]"


def clarify(ctx: ToolContext, question: str, choices: list[object] | None = None) -> ToolOutcome:
    question = question.strip()
    if not question:
        raise ToolError("question is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise ToolError(f"question is longer than {MAX_QUESTION_CHARS} characters; ask something shorter")
    offered = checkedChoices(choices)
    answer = ctx.askUser(question, offered)
    result: dict[str, object] = {"question": question, "choices_offered": offered,
                                 "user_response": userResponse(answer)}
    if answer.action == DEFERRED:
        result["note"] = ("The question was shown to the user as your message and your turn ended here: "
                          "the user's next message is the answer.")
    extras = {"question": question, "choices": offered, "action": answer.action, "answer": answer.text}
    return ToolOutcome(jsonText(result), extras, failed=False, endsTurn=answer.action == DEFERRED)


CLARIFY = Tool(
    "clarify",
    "Ask the user a question when you cannot go on without their answer (a choice between "
    "approaches, a missing detail). Offer up to 4 short choices when there are clear options; "
    "the user may always answer in their own words. Do not use it for permission to run tools: "
    "the agent asks about those itself.",
    parameters(
        ["question"],
        question={"type": "string", "description": "The question, complete and self-contained"},
        choices={"type": "array", "items": {"type": "string"}, "maxItems": MAX_CHOICES,
                 "description": "Up to 4 answers to choose from (optional)"},
    ),
    clarify,
    title="Ask the user",
    kind="think",
)
