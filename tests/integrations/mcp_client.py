"""The SDK's real client for the kit's tests: headers carrying the identity, the Tasks
extension's requests (which SDK 2.3.0 does not carry), and server processes to kill."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult, ElicitResult, InputRequiredResult, Request, Result
from pydantic import ConfigDict

from agentdb.integrations.mcp import ERROR_META, TASKS_EXTENSION, TaskParams, UpdateTaskParams

ROOT = Path(__file__).resolve().parents[2]


class CreatedTask(Result):
    """A ``CreateTaskResult`` (``resultType: "task"``), as the client receives it."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


async def _unresolved(created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
    raise AssertionError("call with allow_claimed=True and poll tasks/get")


class Answer(Result):
    """Any result: what the Tasks extension's requests answer, as a dict by its wire keys."""

    model_config = ConfigDict(extra="allow")


class TasksClient(ClientExtension):
    """Declares the Tasks extension and accepts its ``resultType: "task"`` answer."""

    identifier = TASKS_EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=_unresolved)]


class GetTask(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"


class CancelTask(Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


class UpdateTask(Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


@contextlib.asynccontextmanager
async def connect(
    url: str, tenant: object, principal: str = "alice", *, tasks: bool = True
) -> AsyncIterator[Client]:
    """A client whose requests carry the tenant and principal headers (``from_headers``),
    declaring the Tasks extension unless ``tasks`` is false."""
    headers = {"x-agentdb-tenant": str(tenant), "x-agentdb-principal": principal}
    http = create_mcp_http_client(headers=headers)
    extensions = [TasksClient()] if tasks else []
    async with http, Client(streamable_http_client(url, http_client=http),
                            extensions=extensions, cache=None) as client:  # fmt: skip
        yield client


async def start_task(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    created = await client.session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(created, CreatedTask), created
    return created.task_id


async def _send(client: Client, request: Request[Any, Any]) -> dict[str, Any]:
    answer = await client.session.send_request(request, Answer)
    return answer.model_dump(by_alias=True, mode="json")


async def get_task(client: Client, task_id: str) -> dict[str, Any]:
    return await _send(client, GetTask(params=TaskParams(task_id=task_id)))


async def cancel_task(client: Client, task_id: str) -> dict[str, Any]:
    return await _send(client, CancelTask(params=TaskParams(task_id=task_id)))


async def update_task(client: Client, task_id: str, responses: dict[str, Any]) -> dict[str, Any]:
    params = UpdateTaskParams(task_id=task_id, input_responses=responses)
    return await _send(client, UpdateTask(params=params))


async def ask_approval(client: Client, key: str, amount: int = 7) -> InputRequiredResult:
    """Call ``pay_approved`` without an approval: the kit asks for one."""
    asked = await client.session.call_tool(
        "pay_approved", {"to": "bob", "amount": amount}, meta=_meta(key),
        allow_input_required=True,
    )  # fmt: skip
    assert isinstance(asked, InputRequiredResult), asked
    return asked


async def present_approval(
    client: Client, key: str, asked: InputRequiredResult, amount: int = 7
) -> CallToolResult:
    """Call ``pay_approved`` again with the approval ``asked`` for, accepted."""
    yes = ElicitResult(action="accept", content={"approve": True})
    result = await client.session.call_tool(
        "pay_approved", {"to": "bob", "amount": amount}, meta=_meta(key),
        input_responses={"agentdb.approval": yes}, request_state=asked.request_state,
    )  # fmt: skip
    assert isinstance(result, CallToolResult), result
    return result


def _meta(key: str) -> Any:
    """A request's ``_meta`` with the caller's idempotency key (what Pydantic AI sends)."""
    return {"idempotency_key": key}


def typed_error(result: CallToolResult) -> dict[str, Any]:
    """The agentdb error a tool error result names (``_meta[ERROR_META]``)."""
    assert result.is_error, result
    found = (result.meta or {}).get(ERROR_META)
    assert isinstance(found, dict), result
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``python -m tests.integrations.<module>`` on a fixed port: start, wait, SIGKILL, again.

    ``module``: ``mcp_server`` (the SDK's ``MCPServer``) or ``fastmcp_server``
    (FastMCP with the kit's middleware); ``env``: what the process adds to ours.
    """

    def __init__(
        self,
        dsn: str,
        *,
        bare: bool = False,
        port: int | None = None,
        module: str = "mcp_server",
        env: dict[str, str] | None = None,
    ) -> None:
        self.dsn, self.bare, self.port = dsn, bare, port or free_port()
        self.module, self.env = module, dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        argv = [sys.executable, "-m", f"tests.integrations.{self.module}", str(self.port), self.dsn]
        env = dict(os.environ, PYTHONPATH=str(ROOT), AGENTDB_TESTING_DSN=self.dsn, **self.env)
        self.proc = subprocess.Popen(
            [*argv, *(["--bare"] if self.bare else [])], env=env, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def wait_up(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            assert self.proc is not None
            assert self.proc.poll() is None, "the server exited"
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return
            time.sleep(0.05)
        raise TimeoutError(f"the MCP server on {self.port} did not come up")

    @contextlib.contextmanager
    def running(self) -> Iterator[ServerProcess]:
        """Started and up for the block; stopped (SIGKILL) after it."""
        self.start()
        try:
            self.wait_up()
            yield self
        finally:
            self.stop()

    def kill(self) -> None:
        """SIGKILL: nothing runs, the database drops its sessions (and their locks)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.kills += 1
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
