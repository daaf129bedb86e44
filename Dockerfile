FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY protos ./protos
COPY gcs ./gcs
COPY migrations ./migrations
RUN pip install --no-cache-dir .
EXPOSE 6379 9090
ENTRYPOINT ["gcs"]
CMD ["serve", "--host", "0.0.0.0", "--port", "6379", "--metrics-port", "9090"]
