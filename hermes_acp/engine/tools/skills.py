"""Hermes' skill tools: ``skills_list``, ``skill_view`` and ``skill_manage`` (``engine.skills``).

``skill_view`` reads a skill's ``SKILL.md``, or one file inside its folder (never one that a
link or ``..`` leads out of, nor a binary or oversized one). ``skill_manage`` changes only the
user's own skills (``$HERMES_HOME/skills``; a project's are read-only), and each change is asked
like an edit, with its diff (``ToolContext.approveSkillEdit``): the user's answer, or a mode
that accepts edits; plan mode refuses. Every write replaces its file atomically.
"""

from __future__ import annotations

import os
import shutil
from posixpath import normpath as posixNormpath
from typing import Any

from hermes_acp.engine.access import EditProposal
from hermes_acp.engine.atomic import replaceFile
from hermes_acp.engine.memory import knownSecrets
from hermes_acp.engine.sensitive import inside, secretKind
from hermes_acp.engine.skills import (
    NAME_CHARS, NAME_PATTERN, SKILL_MD_CHARS, SUPPORT_FILE_BYTES, SUPPORT_FOLDERS, Catalog, InvalidSkill, Skill,
    SkillLibrary, checkName, linkedFiles, parseDocument, readText,
)
from hermes_acp.engine.tools.patching import replaceMatches, uniqueMatches
from hermes_acp.engine.tools.registry import Tool, ToolContext, ToolError, ToolOutcome, jsonText, parameters

ACTIONS = ("create", "patch", "edit", "delete", "write_file", "remove_file")


def _library(ctx: ToolContext) -> tuple[SkillLibrary, Catalog]:
    if ctx.skills is None:
        raise ToolError("skills are not available in this session")
    return ctx.skills, ctx.skills.catalog(ctx.cwd)


def _find(catalog: Catalog, name: str) -> Skill:
    """The skill called ``name`` (or ``category/name``, as Hermes takes it)."""
    if os.path.isabs(name) or ".." in name.split("/"):
        raise ToolError(f"{name[:100]!r} is not a skill name; skills_list lists them")
    category, _, bare = name.rpartition("/")
    skill = catalog.find(bare)
    if skill is None or (category and skill.category != category):
        known = ", ".join(s.name for s in catalog.skills[:20]) or "none yet"
        raise ToolError(f"skill {name[:100]!r} not found; available: {known}")
    return skill


def listSkills(ctx: ToolContext, category: str | None = None) -> ToolOutcome:
    _, catalog = _library(ctx)
    skills = [s for s in catalog.skills if category is None or s.category == category]
    items = [{"name": s.name, "description": s.description, "category": s.category, "source": s.source}
             for s in sorted(skills, key=lambda s: (s.category or "", s.name))]
    result: dict[str, Any] = {"success": True, "skills": items, "categories": catalog.categories(), "count": len(items)}
    if items:
        result["hint"] = "Use skill_view(name) to see full content and linked files"
    else:
        result["message"] = (f"No skills{f' in category {category!r}' if category else ''}. "
                             "skill_manage(action='create') makes one in the user's folder.")
    return ToolOutcome(jsonText(result))


def _checkedRelative(file_path: str) -> str:
    """``file_path`` as a path inside a skill's folder; ToolError for one that could leave it."""
    if not file_path.strip():
        raise ToolError("file_path is empty")
    if os.path.isabs(file_path) or file_path.startswith("~"):
        raise ToolError(f"file_path {file_path[:200]!r} must be relative to the skill's folder, e.g. references/api.md")
    if ".." in file_path.replace("\\", "/").split("/"):
        raise ToolError(f"file_path {file_path[:200]!r} leads out of the skill's folder ('..' is not allowed)")
    return posixNormpath(file_path)


def _secretByName(relative: str) -> str | None:
    """What secret a skill's file is by its name alone (``.env``, keys, ``.ssh/``...): judged under
    a neutral root, since the user's skills live in ``$HERMES_HOME``, which is secret as a whole."""
    return secretKind(os.path.join(os.sep, "hermes-acp-skill", relative), env={"HOME": os.sep + "nonexistent",
                                                                             "HERMES_HOME": os.sep + "nonexistent"})


def viewSkill(ctx: ToolContext, name: str, file_path: str | None = None) -> ToolOutcome:
    library, catalog = _library(ctx)
    skill = _find(catalog, name)
    if file_path:
        return _viewFile(skill, file_path)
    try:
        document = library.read(skill)
    except InvalidSkill as e:
        raise ToolError(f"skill {skill.name!r} ({skill.path}) cannot be read: {e}") from None
    files = linkedFiles(skill.folder)
    result: dict[str, Any] = {
        "success": True, "name": skill.name, "description": skill.description, "content": document.text,
        "path": skill.path, "skill_dir": skill.folder, "source": skill.source, "category": skill.category,
        "linked_files": files or None,
        "usage_hint": "To view linked files, call skill_view(name, file_path) where file_path is e.g. "
                      "'references/api.md'" if files else None,
    }
    for field in ("compatibility", "metadata", "license", "allowed-tools"):
        if document.front.get(field) is not None:
            result[field] = document.front[field]
    if not skill.writable:
        result["note"] = "This skill comes from the project (read-only); skill_manage changes only the user's own."
    return ToolOutcome(jsonText(result), {"path": skill.path})


def _viewFile(skill: Skill, file_path: str) -> ToolOutcome:
    relative = _checkedRelative(file_path)
    target = os.path.join(skill.folder, relative)
    real, folder = os.path.realpath(target), os.path.realpath(skill.folder)
    if not inside(real, folder) or real == folder:
        raise ToolError(f"{relative} leads to {real}, outside the skill's folder; it was not read")
    secret = _secretByName(os.path.relpath(real, folder))
    if secret is not None:
        raise ToolError(f"{relative} is {secret}; skill_view does not show it")
    try:
        if os.stat(real).st_nlink > 1:
            raise ToolError(f"{relative} has other names (hard links) that may be outside the skill; it was not read")
        content = readText(real, SUPPORT_FILE_BYTES)
    except FileNotFoundError:
        raise _missing(skill, relative) from None
    except InvalidSkill as e:
        if not os.path.exists(real):
            raise _missing(skill, relative) from None
        raise ToolError(f"{relative} of skill {skill.name!r} was not read: {e}") from None
    result = {"success": True, "name": skill.name, "file": relative, "content": content, "path": real}
    return ToolOutcome(jsonText(result), {"path": real})


def _missing(skill: Skill, relative: str) -> ToolError:
    files = [path for group in linkedFiles(skill.folder).values() for path in group]
    return ToolError(f"{relative} not found in skill {skill.name!r}; its files: {', '.join(files) or 'only SKILL.md'}")


# -- skill_manage ---------------------------------------------------------------------


def _approved(ctx: ToolContext, path: str, old: str | None, new: str) -> dict[str, Any]:
    verdict = ctx.approveSkillEdit(EditProposal("skill_manage", path, old, new))
    if not verdict.allowed:
        raise ToolError(verdict.message, {"path": path, "denied": True})
    return {"path": path, "oldText": old, "newText": new}


def _write(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (a reader sees the old file or the new one)."""
    replaceFile(path, text)


def _checkedDocument(content: str, name: str) -> None:
    """``content`` as a ``SKILL.md`` of the skill ``name``; ToolError saying what to fix."""
    try:
        document = parseDocument(content)
    except InvalidSkill as e:
        raise ToolError(f"the SKILL.md is not valid: {e}. It needs front matter between '---' lines with "
                        f"name: {name} and description: (what it does and when to use it), then instructions") from None
    if document.front["name"] != name:
        raise ToolError(f"the front matter's name {document.front['name']!r} must be the skill's name {name!r}")
    if not document.body.strip():
        raise ToolError("the SKILL.md has no instructions after its front matter")


def _noSecrets(text: str) -> None:
    """Skills are read by later sessions and other agents: no credential of the user's goes in
    (the environment's, and ``$HERMES_HOME/.env``'s as it is now, as for memory). Unlike a memory
    entry, a value merely shaped like a key is let through: a skill about configuration shows
    ``token: ${GITHUB_TOKEN}`` and example keys."""
    if any(secret in text for secret in knownSecrets()):
        raise ToolError("the content holds one of your secret values (a key, token or password from the "
                        "environment or .env); skills never keep one")


def _owned(library: SkillLibrary, skill: Skill) -> str:
    """The skill's folder, when ``skill_manage`` may change it: the user's, not a link, inside their folder."""
    if not skill.writable:
        raise ToolError(f"skill {skill.name!r} comes from the project ({skill.path}) and is read-only here; "
                        "skill_manage changes only the user's own skills")
    root, folder = os.path.realpath(library.userRoot), skill.folder
    if os.path.islink(folder) or not inside(os.path.realpath(folder), root) or os.path.realpath(folder) == root:
        raise ToolError(f"skill {skill.name!r}'s folder {folder} does not stay inside {library.userRoot}; "
                        "it is not changed")
    return folder


def _supportTarget(folder: str, file_path: str, skillMd: bool) -> tuple[str, str]:
    """(relative, absolute) for a file ``skill_manage`` may write: ``SKILL.md`` (when ``skillMd``)
    or one under a support folder, with no link on the way."""
    relative = _checkedRelative(file_path)
    if skillMd and relative == "SKILL.md":
        return relative, os.path.join(folder, relative)
    parts = relative.split("/")
    if parts[0] not in SUPPORT_FOLDERS or len(parts) < 2:
        raise ToolError(f"file_path must be under {', '.join(SUPPORT_FOLDERS)} (e.g. references/notes.md), "
                        f"not {relative!r}")
    secret = _secretByName(relative)
    if secret is not None:
        raise ToolError(f"{relative} would be {secret}; skills do not keep secrets")
    target = os.path.join(folder, relative)
    if os.path.realpath(target) != os.path.join(os.path.realpath(folder), relative):
        raise ToolError(f"{relative} goes through a link; skill_manage does not follow links")
    return relative, target


def _current(path: str, limit: int) -> str | None:
    try:
        return readText(path, limit)
    except InvalidSkill as e:
        if not os.path.lexists(path):
            return None
        raise ToolError(f"{path} cannot be changed: {e}") from None


def manageSkill(ctx: ToolContext, action: str, name: str, content: str | None = None,
                old_string: str | None = None, new_string: str | None = None, replace_all: bool = False,
                category: str | None = None, file_path: str | None = None, file_content: str | None = None,
                absorbed_into: str | None = None) -> ToolOutcome:
    library, catalog = _library(ctx)
    try:
        checkName(name)
    except InvalidSkill as e:
        raise ToolError(f"name {name[:100]!r}: {str(e).removeprefix('its ')}") from None
    if action == "create":
        return _create(ctx, library, catalog, name, content, category)
    skill = _find(catalog, name)
    folder = _owned(library, skill)
    with ctx.locks.held(folder):
        if action == "edit":
            if not content:
                raise ToolError("content is required for 'edit': the whole new SKILL.md")
            return _replace(ctx, skill, skill.path, content, "SKILL.md", f"Skill {name!r} updated (full rewrite).")
        if action == "patch":
            return _patch(ctx, skill, folder, old_string, new_string, replace_all, file_path)
        if action == "delete":
            return _delete(ctx, library, catalog, skill, folder, absorbed_into)
        if action == "write_file":
            if not file_path or file_content is None:
                raise ToolError("file_path and file_content are required for 'write_file'")
            relative, target = _supportTarget(folder, file_path, skillMd=False)
            if len(file_content.encode("utf-8")) > SUPPORT_FILE_BYTES:
                raise ToolError(f"file_content is over {SUPPORT_FILE_BYTES:,} bytes; split it into smaller files")
            return _replace(ctx, skill, target, file_content, relative,
                            f"File {relative!r} written to skill {name!r}.")
        if not file_path:
            raise ToolError("file_path is required for 'remove_file'")
        return _removeFile(ctx, skill, folder, file_path)


def _create(ctx: ToolContext, library: SkillLibrary, catalog: Catalog, name: str, content: str | None,
            category: str | None) -> ToolOutcome:
    if name in library.reserved:
        raise ToolError(f"{name!r} is the name of one of the agent's own slash commands (/{name}); "
                        "choose another name")
    existing = catalog.find(name)
    if existing is not None and not existing.writable:
        raise ToolError(f"a skill named {name!r} already exists ({existing.path}), the project's (read-only); "
                        "choose another name")
    if existing is not None:
        raise ToolError(f"a skill named {name!r} already exists ({existing.path}); use patch or edit to change it")
    if category is not None and category.strip():
        category = category.strip()
        if len(category) > NAME_CHARS or not NAME_PATTERN.match(category):
            raise ToolError(f"category {category[:100]!r} must be one folder name: lowercase letters, digits, "
                            "'-', '.' and '_'")
    else:
        category = None
    if not content:
        raise ToolError("content is required for 'create': the whole SKILL.md (front matter, then instructions)")
    _checkedDocument(content, name)
    _noSecrets(content)
    root = library.userRoot
    folder = os.path.join(root, *(p for p in (category, name) if p))
    parent = os.path.dirname(folder)
    if os.path.lexists(folder):
        raise ToolError(f"{folder} already exists (without a usable SKILL.md: /doctor says why); "
                        "choose another name or remove it")
    if category and os.path.islink(parent):
        raise ToolError(f"{parent} is a link; skill_manage does not follow links")
    if category and os.path.lexists(os.path.join(parent, "SKILL.md")):  # its subfolders are not searched
        raise ToolError(f"{category!r} is a skill, not a category: a skill inside it would never be found; "
                        "choose another category")
    path = os.path.join(folder, "SKILL.md")
    extras = _approved(ctx, path, None, content)
    try:
        os.makedirs(folder, mode=0o700)
        _write(path, content)
    except OSError as e:
        raise ToolError(f"cannot create {path}: {e}") from e
    result: dict[str, Any] = {
        "success": True, "message": f"Skill {name!r} created.", "path": os.path.relpath(folder, root),
        "skill_md": path,
        "hint": f"To add reference files, templates or scripts, use skill_manage(action='write_file', "
                f"name='{name}', file_path='references/example.md', file_content='...')",
    }
    if category:
        result["category"] = category
    return ToolOutcome(jsonText(result), extras)


def _replace(ctx: ToolContext, skill: Skill, path: str, new: str, label: str, message: str) -> ToolOutcome:
    if label == "SKILL.md":
        _checkedDocument(new, skill.name)
    _noSecrets(new)
    limit = 4 * SKILL_MD_CHARS if label == "SKILL.md" else SUPPORT_FILE_BYTES
    old = _current(path, limit)
    if old == new:
        return ToolOutcome(jsonText({"success": True, "message": f"{label} already has this content; nothing changed."}))
    extras = _approved(ctx, path, old, new)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        _write(path, new)
    except OSError as e:
        raise ToolError(f"cannot write {path}: {e}") from e
    return ToolOutcome(jsonText({"success": True, "message": message, "path": path}), extras)


def _patch(ctx: ToolContext, skill: Skill, folder: str, old_string: str | None, new_string: str | None,
           replace_all: bool, file_path: str | None) -> ToolOutcome:
    if not old_string:
        raise ToolError("old_string is required for 'patch': the text to find")
    if new_string is None:
        raise ToolError("new_string is required for 'patch' (an empty string deletes the text)")
    relative, target = _supportTarget(folder, file_path or "SKILL.md", skillMd=True)
    content = _current(target, 4 * SKILL_MD_CHARS if relative == "SKILL.md" else SUPPORT_FILE_BYTES)
    if content is None:
        raise ToolError(f"{relative} not found in skill {skill.name!r}")
    _, matches = uniqueMatches(content, old_string, new_string, replace_all, relative)
    updated = replaceMatches(content, matches)
    count = len(matches)
    return _replace(ctx, skill, target, updated, relative,
                    f"Patched {relative} in skill {skill.name!r} ({count} replacement{'s' if count > 1 else ''}).")


def _delete(ctx: ToolContext, library: SkillLibrary, catalog: Catalog, skill: Skill, folder: str,
            absorbed_into: str | None) -> ToolOutcome:
    absorbed = (absorbed_into or "").strip()
    if absorbed and (absorbed == skill.name or catalog.find(absorbed) is None):
        raise ToolError(f"absorbed_into={absorbed[:100]!r} must name another existing skill")
    old = _current(skill.path, 4 * SKILL_MD_CHARS) or ""
    extras = _approved(ctx, skill.path, old, "")
    try:
        shutil.rmtree(folder)
    except OSError as e:
        raise ToolError(f"cannot delete {folder}: {e}") from e
    parent = os.path.dirname(folder)
    if os.path.realpath(parent) != os.path.realpath(library.userRoot):
        try:
            os.rmdir(parent)  # an empty category folder goes too
        except OSError:
            pass
    message = f"Skill {skill.name!r} deleted." + (f" Content absorbed into {absorbed!r}." if absorbed else "")
    return ToolOutcome(jsonText({"success": True, "message": message}), extras)


def _removeFile(ctx: ToolContext, skill: Skill, folder: str, file_path: str) -> ToolOutcome:
    relative, target = _supportTarget(folder, file_path, skillMd=False)
    if os.path.islink(target) or not os.path.isfile(target):
        raise _missing(skill, relative)
    old = _current(target, SUPPORT_FILE_BYTES)
    extras = _approved(ctx, target, old, "")
    try:
        os.unlink(target)
    except OSError as e:
        raise ToolError(f"cannot remove {target}: {e}") from e
    parent = os.path.dirname(target)
    while parent != folder and inside(parent, folder):
        try:
            os.rmdir(parent)  # empty folders it leaves go too
        except OSError:
            break
        parent = os.path.dirname(parent)
    return ToolOutcome(jsonText({"success": True, "message": f"File {relative!r} removed from skill {skill.name!r}."}),
                       extras)


SKILLS_LIST = Tool(
    "skills_list",
    "List available skills (name + description). Use skill_view(name) to load full content.",
    parameters([], category={"type": "string", "description": "Optional category filter to narrow results"}),
    listSkills,
)

SKILL_VIEW = Tool(
    "skill_view",
    "Load a skill: its SKILL.md, with a list of its linked files (references, templates, scripts, "
    "assets); with file_path, one of those files.",
    parameters(
        ["name"],
        name={"type": "string", "description": "The skill's name (skills_list lists them)"},
        file_path={"type": "string", "description": "A file in the skill's folder, e.g. references/api.md; "
                   "omit for SKILL.md"},
    ),
    viewSkill,
)

SKILL_MANAGE = Tool(
    "skill_manage",
    "Create or change the user's skills (in $HERMES_HOME/skills; a project's are read-only); the user "
    "approves each change. create: a whole SKILL.md (front matter with name and description, what it does "
    "and when to use it; then the steps), optional category. patch: old_string -> new_string in SKILL.md or "
    "file_path. edit: a whole new SKILL.md. delete. write_file, remove_file: file_path under references/, "
    "templates/, scripts/ or assets/. Offer to save a procedure that took work; ask before creating or deleting.",
    parameters(
        ["action", "name"],
        action={"type": "string", "enum": list(ACTIONS)},
        name={"type": "string", "description": "lowercase letters, digits, '-', '.', '_'; at most 64"},
        content={"type": "string", "description": "The whole SKILL.md (create, edit)"},
        old_string={"type": "string", "description": "Text to replace (patch); unique unless replace_all"},
        new_string={"type": "string", "description": "Its replacement (patch); may be empty"},
        replace_all={"type": "boolean", "default": False},
        category={"type": "string", "description": "A folder to group it in (create)"},
        file_path={"type": "string", "description": "A file of the skill (write_file, remove_file; patch: "
                   "default SKILL.md)"},
        file_content={"type": "string", "description": "The file's content (write_file)"},
        absorbed_into={"type": "string", "description": "delete: the skill that took its content, if any"},
    ),
    manageSkill,
)
