"""The framework adapters, one package each, each loaded only by its extra.

    effectd_client.contrib.agent_framework  pip install '...[agent-framework]'
    effectd_client.contrib.crewai           pip install '...[crewai]'
    effectd_client.contrib.google_adk       pip install '...[google-adk]'
    effectd_client.contrib.langgraph        pip install '...[langgraph]'
    effectd_client.contrib.mcp              pip install '...[mcp]'
    effectd_client.contrib.openai_agents    pip install '...[openai-agents]'
    effectd_client.contrib.pydantic_ai      pip install '...[pydantic-ai]'

(`...` is `./clients/python` in a checkout, or the wheel of `make dist`.)

Writing a new adapter (say `effectd_client.contrib.crewai`):

1. A package `contrib/<framework>/`: its public names in `__init__.py` with an
   `__all__` (a test pins it), its private parts beside it as `_*.py` modules
   of the same package. `import effectd_client` never imports it.
2. It imports the public client only: the names of `effectd_client`, the
   rules of `effectd_client.policy`, and the adapter's extension surface
   `effectd_client.extend` (outcomes, the safe call's judgement of an answer,
   the MCP policy). Never `effectd_client._*`, never another adapter's
   package: `tests/repository/test_layers.py` fails on either. A name it needs that is
   not public is added to `effectd_client.extend`.
3. Its framework in `clients/python/pyproject.toml` as an extra, pinned; its
   page in `docs/<framework>.md` importing from `effectd_client.contrib.<framework>`;
   its tests in `tests/clients/` against the real framework package.

The adapters that existed before this folder keep their first import paths
(`effectd_client.langgraph`, ...) as re-exports of these packages.
"""
