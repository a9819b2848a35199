# posttrain_env server: gateway + worker + embedded Temporal, on 0.0.0.0:8000.
#
#   docker build -t posttrain-env .
#   docker run -p 8000:8000 -v posttrain-state:/state \
#     -e POSTTRAIN_API_KEYS=<random key> -e POSTTRAIN_ALLOWED_HOSTS=<your host name> \
#     posttrain-env
#
# It binds 0.0.0.0, so it refuses to start without POSTTRAIN_API_KEYS (exit status 2).
# Episodes, the server key and the embedded Temporal database live in the /state volume.
FROM python:3.11-slim

COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /uvx /bin/

ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    PYTHONUNBUFFERED=1 \
    POSTTRAIN_STATE_DIR=/state
# The local backend runs jobs with this interpreter, as an unprivileged uid.
ENV POSTTRAIN_JOB_PYTHON=/usr/local/bin/python3

WORKDIR /app
# Dependencies first (a layer that survives source edits), then the project itself.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project
COPY . .
RUN uv sync --frozen --no-dev

VOLUME /state
EXPOSE 8000
ENV PATH="/app/.venv/bin:$PATH"
CMD ["server", "--host", "0.0.0.0", "--port", "8000"]
