# Image for docker-compose.yaml (users' machines): Airflow 3 + PySpark 4 + the redelivery package.
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
        procps make && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/redelivery
COPY requirements.txt pyproject.toml ./
RUN pip install --no-cache-dir uv==0.13.8 && uv pip sync --system requirements.txt
COPY . .
RUN uv pip install --system --no-deps .   # the distribution, as a user installs it (no editable path)
