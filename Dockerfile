FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY protos ./protos
COPY gcs ./gcs
RUN pip install --no-cache-dir .
# 6379: gRPC (Ray's GCS port); 9379: Prometheus metrics
EXPOSE 6379 9379
# grpc.health.v1 over the served port; SERVING once the store is loaded and gRPC is up
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
  CMD ["gcs", "health", "--address", "127.0.0.1:6379"]
ENTRYPOINT ["gcs"]
CMD ["serve", "--host", "0.0.0.0", "--port", "6379", "--metrics-port", "9379"]
