"""The gateway: OpenEnv and MCP over HTTP, each call a Temporal update or query (stateless).

app.py           the app factory and the HTTP routes
openenv_ws.py    the OpenEnv WebSocket, `/ws`
jsonrpc.py       OpenEnv's JSON-RPC methods (`POST /mcp`)
episode_mcp.py   the standard MCP endpoint of an episode, `/episodes/<id>/mcp`
episodes_route.py  `POST /episodes` for MCP-only clients
protocol.py      reset, step, state and direct tool calls, whatever the transport
sessions.py      session ids and the session -> episode resolution
episode_calls.py tool calls into an episode's workflow (bounded before they are sent)
observations.py  the OpenEnv wire shapes of our answers
bounds.py        JSON nesting; where the body limits are set
auth.py, guard.py  API keys and episode tokens; Host and Origin checks, the access log

It imports the contract (`posttrain_env`) and the workflows it calls, never an activity or a
backend (a test checks that `server --no-worker` loads no module of `activities/`).
"""
