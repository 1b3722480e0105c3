# The deltamirror image: the `deltamirror` command (watcher and CLI), plus the script that creates
# the demo table of docker-compose.yml.
#
#   docker build -t deltamirror .
#   docker run --rm deltamirror --help
#
# Two stages: the first builds the wheel from the sources, the second installs it, so the image
# holds neither the sources nor the build tools.

FROM python:3.11-slim AS build
WORKDIR /src
# exactly what the package is built from (pyproject.toml maps these folders to deltamirror.*)
COPY pyproject.toml README.md LICENSE ./
COPY core/ core/
COPY mirror/ mirror/
COPY ops/ ops/
COPY producer/ producer/
COPY consumer/ consumer/
COPY cli/ cli/
COPY devkafka/ devkafka/
COPY root/ root/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
# deltalake (delta-rs) only writes the demo table; the watcher never imports it
RUN pip install --no-cache-dir /wheels/deltamirror-*.whl "deltalake>=1.0" \
    && rm -rf /wheels
COPY scripts/make_demo_table.py /opt/deltamirror/scripts/make_demo_table.py

# an unprivileged user; /data is where the demo keeps its table (a named volume takes its owner)
RUN groupadd --system --gid 10001 deltamirror \
    && useradd --system --uid 10001 --gid deltamirror --create-home --home-dir /home/deltamirror deltamirror \
    && mkdir -p /data \
    && chown deltamirror:deltamirror /data
USER deltamirror
WORKDIR /home/deltamirror

# metrics and health (deltamirror watch --metrics-port 9464)
EXPOSE 9464
ENTRYPOINT ["deltamirror"]
CMD ["--help"]
