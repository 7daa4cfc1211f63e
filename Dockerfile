# The `flowforge` image: one binary, run as a non-root user.
#
#   docker build -t flowforge .
#
# The base images are build arguments whose defaults are the public images;
# `cargo xtask images` builds this same file with them pointed at local
# images (for machines that cannot pull), so what CI builds is what ships.

ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS builder
# PEM certificates to trust while fetching crates (a TLS-intercepting
# proxy's CA); empty on an ordinary network. This stage never ships.
ARG EXTRA_CA_CERTS=""
RUN if [ -n "$EXTRA_CA_CERTS" ]; then \
        printf '%s\n' "$EXTRA_CA_CERTS" > /usr/local/share/ca-certificates/extra.crt \
        && update-ca-certificates; \
    fi
WORKDIR /src
# Only the workspace's manifests and the crates the binary is built from
# (not the examples, which the runtime stage copies), so that only a
# change to those rebuilds it. A new workspace member is listed here too.
COPY Cargo.toml Cargo.lock ./
COPY domain domain
COPY ports ports
COPY adapters-postgres adapters-postgres
COPY adapters-sqlite adapters-sqlite
COPY adapters-rabbit adapters-rabbit
COPY adapters-inproc adapters-inproc
COPY adapters-http adapters-http
COPY app app
COPY bins bins
# xtask and testkit (test support) are members, so cargo needs their
# manifests, but the binary uses neither: an empty main and an empty
# library stand in for their code, which changes often.
COPY xtask/Cargo.toml xtask/Cargo.toml
COPY testkit/Cargo.toml testkit/Cargo.toml
RUN mkdir xtask/src testkit/src \
    && printf '//! Stand-in.\nfn main() {}\n' > xtask/src/main.rs \
    && printf '//! Stand-in.\n' > testkit/src/lib.rs
RUN cargo build --release --locked -p flowforge-bins --bin flowforge \
    && cp target/release/flowforge /usr/local/bin/flowforge

FROM ${RUNTIME_IMAGE}
# A fixed numeric id, so orchestrators can check `runAsNonRoot`. Its home
# is the working folder: `flowforge run` keeps its SQLite file there.
RUN groupadd --system --gid 10001 flowforge \
    && useradd --system --uid 10001 --gid flowforge --create-home --home-dir /home/flowforge flowforge
COPY --from=builder /usr/local/bin/flowforge /usr/local/bin/flowforge
COPY examples /examples
# glibc's allocator, kept from holding on to what reconnects freed
# (docs/design/cli.md#memory).
ENV GLIBC_TUNABLES=glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=131072
USER 10001:10001
WORKDIR /home/flowforge
ENTRYPOINT ["flowforge"]
CMD ["--help"]

# Last, so a new commit only changes these labels, not the layers above.
ARG VERSION=unknown
ARG REVISION=unknown
# The repository URL (`git remote get-url origin`); none is assumed.
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="flowforge" \
      org.opencontainers.image.description="FlowForge, a DAG workflow engine" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0"
