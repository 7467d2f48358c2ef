"""Small manifests the CLI tests share."""

GPU_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: train
spec:
  containers:
    - name: main
      image: cuda
      resources:
        limits:
          nvidia.com/gpu: 1
"""
GPU_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: trainer
spec:
  selector:
    matchLabels: {app: trainer}
  template:
    metadata:
      labels: {app: trainer}
    spec:
      containers:
        - name: main
          image: cuda
          resources:
            limits:
              nvidia.com/gpu: 2
"""
CONFIG_MAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  a: b
"""
