"""The gateway: OpenEnv and MCP over HTTP, each call a Temporal update or query (stateless).

app.py           the app factory and the HTTP routes
openenv_ws.py    the OpenEnv WebSocket, `/ws`
jsonrpc.py       OpenEnv's JSON-RPC methods (`POST /mcp`)
episode_mcp.py   the standard MCP endpoint of an episode, `/episodes/<id>/mcp`
episodes_route.py  `POST /episodes`, `GET` and `DELETE /episodes/<id>` for MCP-only clients
episode_control.py an episode read and ended by its id (behind those routes)
protocol.py      reset, step, state and direct tool calls, whatever the transport
sessions.py      session ids and the session -> episode resolution
episode_calls.py tool calls into an episode's workflow (bounded before they are sent)
observations.py  the OpenEnv wire shapes of our answers
wire.py          openenv's wire types, imported without its Gradio web UI (openenv_slim.py)
bounds.py        JSON nesting; where the body limits are set
auth.py, guard.py  API keys and episode tokens; Host and Origin checks, the access log
refusals.py      401/403/404 bodies (JSON-RPC errors too, on an episode's MCP endpoint)

Layer 5. It imports the contract (`posttrain_env`, `posttrain_common`) and the workflows it
calls, never an activity or a backend (a test checks that `server --no-worker` loads no module
of `activities/` but the backends' declarations, which say whether API keys are required).
"""
