"""Sphinx configuration of straggler's documentation (Markdown pages through MyST-Parser, the
API reference from the numpydoc docstrings). Build: ``sphinx-build -W --keep-going -b html docs
OUT`` with the ``docs`` extra installed (``pip install '.[docs]'``)."""

import importlib.metadata

from sphinx.util.docutils import SphinxDirective

project = "straggler"
author = "straggler contributors"
copyright = "straggler contributors, Apache-2.0"
try:
    release = importlib.metadata.version("straggler")
except importlib.metadata.PackageNotFoundError:  # building from a tree that is not installed
    release = "unreleased"
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# README.md is for readers browsing the folder on a forge; it is not a page of the site.
exclude_patterns = ["_build", "README.md", "**/.ipynb_checkpoints"]

myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

# The reference documents each public package's ``__all__`` (re-exports included) in the order
# of the source; numpydoc renders the sections. Class members are listed by autodoc, not by a
# second autosummary table of numpydoc's.
autodoc_default_options = {"members": True, "undoc-members": True, "member-order": "bysource"}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# Every cross reference must resolve (a broken one is a warning, so an error in CI).
nitpicky = True

html_theme = "alabaster"
html_title = "straggler"
html_theme_options = {"description": "Lock-step load balancing for LLM serving"}


# A docstring names an object where it is defined (``straggler.solvers.placement.eplb.
# rebalance_experts``, or a bare name inside its module) while the reference documents it
# under the public package that exports it (``straggler.baselines.rebalance_experts``). This
# resolves such a reference to the public entry when both are the same object; a reference to
# anything that is not public stays unresolved (and fails the build).
PUBLIC = [
    "straggler.formulations",
    "straggler.solvers",
    "straggler.baselines",
    "straggler.proofs",
    "straggler.sim",
    "straggler.runtime.engines",  # before runtime, which re-exports three of its names
    "straggler.runtime",
]


def _public_names():
    import importlib

    names, bare = {}, {}
    for mod in PUBLIC:
        m = importlib.import_module(mod)
        for name in m.__all__:
            names.setdefault(id(getattr(m, name)), f"{mod}.{name}")
            bare.setdefault(name, set()).add(names[id(getattr(m, name))])
        names.setdefault(id(m), mod)
    return names, {k: v.pop() for k, v in bare.items() if len(v) == 1}


def _lookup(target, module):
    import importlib

    candidates = [target] if module is None else [f"{module}.{target}", target]
    for path in candidates:
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            return obj
    return None


_PUBLIC = None


def _resolve_public(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    global _PUBLIC
    if _PUBLIC is None:
        _PUBLIC = _public_names()
    names, bare = _PUBLIC
    target = node["reftarget"]
    obj = _lookup(target, node.get("py:module"))
    public = names.get(id(obj)) if obj is not None else None
    if public is None and "." not in target:  # a bare name one public package exports
        public = bare.get(target)
    if public is None or public == node["reftarget"]:
        return None
    domain = env.get_domain("py")
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], public, node, contnode
    )


def _attr_doc(modname, name, obj):
    """The ``#:`` comment above ``name`` in the module of the package that defines it."""
    import sys

    from sphinx.pycode import ModuleAnalyzer

    for m in sorted(k for k in sys.modules if k.startswith("straggler.")):
        if getattr(sys.modules[m], name, None) is not obj:
            continue
        try:
            docs = ModuleAnalyzer.for_module(m).find_attr_docs()
        except Exception:  # a compiled or source-less module: no comments to read
            continue
        if ("", name) in docs:
            return list(docs[("", name)])
    return []


class PublicData(SphinxDirective):
    """``public-data MODULE``: the constants in ``MODULE.__all__`` (autodoc documents
    functions and classes re-exported through ``__all__``, but a re-exported constant only
    where it is assigned), each with the ``#:`` comment where it is defined."""

    required_arguments = 1

    def run(self):
        import importlib
        import inspect

        from docutils import nodes
        from docutils.statemachine import StringList

        modname = self.arguments[0]
        mod = importlib.import_module(modname)
        lines = []
        for name in mod.__all__:
            obj = getattr(mod, name)
            if callable(obj) or inspect.ismodule(obj):
                continue
            lines += [f".. py:data:: {name}", f"   :module: {modname}"]
            value = repr(obj)
            if len(value) <= 80:
                lines.append(f"   :value: {value}")
            lines.append("")
            lines += [f"   {line}" for line in _attr_doc(modname, name, obj)]
            lines.append("")
        node = nodes.container()
        self.state.nested_parse(StringList(lines), self.content_offset, node)
        return node.children


def setup(app):
    app.connect("missing-reference", _resolve_public)
    app.add_directive("public-data", PublicData)
