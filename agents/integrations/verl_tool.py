"""A verl tool that searches a searchgym index: multi-turn tool rollouts without a retrieval server.

verl's tool agent loop (``actor_rollout_ref.rollout.multi_turn.tool_config_path``) builds its tools from a
YAML file with ``verl.tools.tool_registry.initialize_tools_from_config``: each entry names a ``BaseTool``
subclass (``class_name``), its ``config`` mapping and its OpenAI function schema (``tool_schema``).
:class:`SearchTool` is such a class. It holds any searchgym retriever (BM25 built in the worker from a
corpus, a dense or hybrid index, a cassette, or a ``/retrieve`` URL; the specs of
:func:`searchgym.retrieval.make_retriever`, shared with the worker's ``SearchQA-v0`` envs on the same
dataset as :func:`searchgym.retrieval.leases.acquire_retriever` shares them) and
answers a ``search(query)`` call with the top-k passages as Search-R1's ``Doc i(Title: …) text`` block,
the text ``SearchQA-v0`` shows the policy (:func:`searchgym.protocol.format_documents`).

The tool's ``config`` keys (:data:`CONFIG_KEYS`) are verl's ``type`` (``native``; verl reads it before
building the tool) and every :class:`~searchgym.envs.EnvSpec` field, with the spec's defaults and checks, so
one block of env settings serves the tool and the worker's ``SearchQA-v0`` envs. The tool applies those of
:data:`APPLIED`:

* ``retriever`` (required): ``bm25``, ``rank_bm25``, ``dense:INDEX_DIR``, ``hybrid:INDEX_DIR``,
  ``cassette:PATH``, or the ``http(s)://`` URL of a Search-R1-compatible ``/retrieve`` endpoint, with its
  ``retriever_patience``;
* ``dataset`` (required unless ``retriever`` is a URL, refused with one: the server holds its corpus):
  ``world`` (the generated encyclopedia), a FlashRAG folder or a Search-R1 parquet folder; ``world_seed``;
* ``retriever_faults``: seeded faults injected into the results (one generator per tool);
* ``on_retrieval_error``: ``raise`` (the model sees verl's ``Error executing tool`` text) or ``observe``
  (the model sees ``Search failed: …`` in ``<information>``, as ``SearchQA-v0`` shows it);
* ``topk`` passages per search, each cut to ``max_passage_words``.

The other fields define the episode around the tool (its split, turns, token budgets, reward and prompt):
verl's rollout settings and the dataset rows' env options (``searchgym prepare verl``) decide those, and in
this config they change nothing.

The contract, read from verl 0.9.1 (``verl/tools/base_tool.py``, ``verl/tools/tool_registry.py``,
``verl/experimental/agent_loop/tool_agent_loop.py``): the tool is built once per agent-loop worker with
``(config, tool_schema)``; for every call the loop awaits ``create(create_kwargs=...)`` → ``(instance_id,
ToolResponse)``, ``execute(instance_id, parameters)`` → ``(ToolResponse, reward, metrics)``, and
``release(instance_id)``. An exception raised by ``execute`` reaches the model as the text ``Error
executing tool 'search': <message>``; a retrieval failure is a
:class:`~searchgym.errors.RetrieverError` whose message names the server and the reason, raised within
the HTTP client's bounded deadline.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

try:
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
except ImportError as e:  # pragma: no cover - depends on the installation
    from searchgym.errors import MissingDependencyError

    raise MissingDependencyError(getattr(e, "name", None) or "verl", "verl", "The verl search tool") from e

from searchgym.data import load_dataset
from searchgym.envs.spec import EnvSpec, make_spec
from searchgym.errors import ConfigError, RetrieverError
from searchgym.protocol import format_documents, format_search_failure
from searchgym.retrieval import make_retriever
from searchgym.retrieval.base import Retriever
from searchgym.retrieval.faults import FaultyRetriever
from searchgym.retrieval.leases import acquire_retriever

__all__ = ["APPLIED", "CONFIG_KEYS", "TOOL_SCHEMA", "SearchTool"]

CONFIG_KEYS = ("type", *EnvSpec.field_names())
"""The keys a :class:`SearchTool` ``config`` mapping may hold: verl's ``type`` and every
:class:`~searchgym.envs.EnvSpec` field."""

APPLIED = (
    "dataset",
    "world_seed",
    "retriever",
    "retriever_patience",
    "retriever_faults",
    "on_retrieval_error",
    "topk",
    "max_passage_words",
)
"""The :class:`~searchgym.envs.EnvSpec` fields a search changes; the others are the episode's, not the
tool's (see the module)."""

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Searches the knowledge base for passages about a query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for, e.g. a name or a short phrase."}
            },
            "required": ["query"],
        },
    },
}
"""The OpenAI function schema used when the tool config gives none."""


def _is_url(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith(("http://", "https://"))


def _check_schema(schema: OpenAIFunctionToolSchema) -> None:
    """A tool schema must declare the one parameter :meth:`SearchTool.execute` reads: a string ``query``."""
    parameters = schema.function.parameters
    query = parameters.properties.get("query")
    if query is None or query.type != "string" or "query" not in parameters.required:
        raise ConfigError(
            f"the tool_schema of the search tool {schema.function.name!r} must declare a required string "
            f"parameter 'query'; it declares {sorted(parameters.properties)} (required: {parameters.required})"
        )


class SearchTool(BaseTool):
    """verl's ``search`` tool over a searchgym retriever: the top-k passages for a query.

    Args:
        config: The tool config's ``config`` mapping (keys in :data:`CONFIG_KEYS`, see the module); the
            env spec it makes is :attr:`spec`.
        tool_schema: The tool config's ``tool_schema``, or ``None`` for :data:`TOOL_SCHEMA`. It must declare
            a required string parameter ``query``; its function name is the tool's name.

    Raises:
        ConfigError: an unknown or missing config key, a bad value, an unknown retriever, a dataset that
            does not exist, or a schema without a string ``query``.
        MissingDependencyError: the retriever needs an extra that is not installed (``dense``, ``server``).
    """

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        config = dict(config or {})
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise ConfigError(f"unknown search tool config key(s) {unknown}; valid keys: {list(CONFIG_KEYS)}")
        if "retriever" not in config:
            raise ConfigError(
                "search tool config is missing the key 'retriever' (bm25, rank_bm25, dense:INDEX_DIR, "
                "hybrid:INDEX_DIR, cassette:PATH, or the http(s):// URL of a /retrieve endpoint)"
            )
        backend = config["retriever"]
        if not isinstance(backend, str):
            raise ConfigError(f"search tool config key 'retriever' must be a string, got {backend!r}")
        if _is_url(backend) and "dataset" in config:
            raise ConfigError(
                f"search tool config key 'dataset' is not used with the retriever URL {backend!r} (the server "
                "holds its own corpus): remove it"
            )
        if not _is_url(backend) and "dataset" not in config:
            raise ConfigError(
                f"search tool config is missing the key 'dataset' (world, a FlashRAG folder or a Search-R1 "
                f"parquet folder), the corpus the retriever {backend!r} searches"
            )
        try:
            self.spec = make_spec(None, {k: v for k, v in config.items() if k != "type"})
        except ConfigError as e:
            raise ConfigError(f"search tool config: {e}") from None
        schema = tool_schema or OpenAIFunctionToolSchema.model_validate(TOOL_SCHEMA)
        _check_schema(schema)
        self.retriever: Retriever
        patience = self.spec.retriever_patience
        passages: Any = ()
        if _is_url(backend):
            self.retriever = make_retriever(backend, (), patience=patience)  # the server holds the corpus
        else:
            # Shared with every SearchQA-v0 env of this worker on the same dataset and retriever, and held for
            # the life of the process: verl builds the tool once per worker and never closes it.
            dataset = load_dataset(self.spec.dataset, world_seed=self.spec.world_seed)
            self.retriever = acquire_retriever(dataset, backend, patience)[0]
            passages = dataset.passages
        if self.spec.retriever_faults is not None:
            self.retriever = FaultyRetriever(self.retriever, self.spec.retriever_faults, passages)
        self._searches: dict[str, int] = {}
        self._lock = threading.Lock()
        super().__init__(config, schema)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Starts an instance (one trajectory's, or one call's in verl's tool agent loop).

        ``create_kwargs`` (a dataset row's ``tools_kwargs.search.create_kwargs``, such as the ground truth
        that Search-R1-style verl data carries) are accepted and not used: searching needs none.
        """
        instance_id = instance_id or str(uuid4())
        with self._lock:
            self._searches[instance_id] = 0
        return instance_id, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Searches for ``parameters["query"]``.

        Returns:
            ``(response, reward, metrics)``: the passages' ``<information>Doc 1(Title: …) …</information>``
            text, 0.0 (a search earns nothing), and ``passage_ids`` (the hits, in rank order) and
            ``searches`` (this instance's, so far).

        Raises:
            ConfigError: the instance was not created, or ``query`` is missing or not a string.
            RetrieverError: the retriever failed (an unreachable server, after the client's retries), with
                ``on_retrieval_error="raise"``.
        """
        with self._lock:
            if instance_id not in self._searches:
                raise ConfigError(f"search tool instance {instance_id!r} does not exist: call create() first")
        query = parameters.get("query") if isinstance(parameters, Mapping) else None
        if not isinstance(query, str):
            raise ConfigError(f"the search tool needs a string 'query' parameter, got {parameters!r}")
        # Off the event loop: the agent loop runs many trajectories' turns concurrently on it.
        try:
            hits = (await asyncio.to_thread(self.retriever.search, [query], self.spec.topk))[0]
            text = format_documents([h.contents for h in hits], self.spec.max_passage_words).strip()
        except RetrieverError as e:
            if self.spec.on_retrieval_error == "raise":
                raise
            hits, text = [], format_search_failure(str(e)).strip()
        with self._lock:
            self._searches[instance_id] = searches = self._searches.get(instance_id, 0) + 1
        return (
            ToolResponse(text=text),
            0.0,
            {"passage_ids": [h.passage_id for h in hits], "searches": searches},
        )

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forgets the instance; the retriever stays, shared by the worker's later calls."""
        with self._lock:
            self._searches.pop(instance_id, None)
