# runner's own image: the capacity search, driving an engine container on the
# host's Docker engine (mount /var/run/docker.sock) or a server already running.
#
#   docker build --build-arg BASE_IMAGE=python:3.11-slim-bookworm -t runner .
#
# BASE_IMAGE may be any Debian-family image; one without python3 (such as the
# debootstrap base that scripts/build-engine-image.sh imports as
# local/debian:bookworm) gets it from apt. PIP_OPTIONS reaches pip unchanged, so a
# machine without PyPI installs from a wheelhouse:
#   --build-arg PIP_OPTIONS="--no-index --find-links http://127.0.0.1:8765/"
# (with `docker build --network host` and the wheelhouse served over HTTP).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

RUN if ! command -v python3 >/dev/null || ! python3 -c "import venv, ensurepip" 2>/dev/null; then \
        apt-get update \
     && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
          python3 python3-venv ca-certificates \
     && rm -rf /var/lib/apt/lists/*; \
    fi

COPY pyproject.toml README.md /src/
COPY runner /src/runner
COPY conf /src/conf
ARG PIP_OPTIONS=""
RUN python3 -m venv /opt/runner \
 && /opt/runner/bin/pip install --no-cache-dir ${PIP_OPTIONS} /src \
 && rm -rf /src

ENV PATH=/opt/runner/bin:${PATH} \
    PYTHONUNBUFFERED=1
WORKDIR /work
# Results, the MLflow store and the cache land in /work: mount a host folder there.
ENTRYPOINT ["python3", "-m", "runner"]
