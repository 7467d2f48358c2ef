"""Small manifests and helpers the CLI tests share."""

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
PRIVILEGED_GPU_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: debug
spec:
  containers:
    - name: main
      image: cuda
      securityContext:
        privileged: true
      resources:
        limits:
          nvidia.com/gpu: 1
"""
# Not GPU-relevant: the default policy only audits it, so it is denied only when every rule is
# evaluated as Enforce.
PRIVILEGED_PLAIN_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: cni
spec:
  containers:
    - name: main
      image: busybox
      securityContext:
        privileged: true
"""
# Warned under the default policy: a HAMi resource beside the GPU.
WARNED_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: hami
spec:
  tolerations:
    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
  containers:
    - name: main
      image: cuda
      resources:
        limits:
          nvidia.com/gpu: 1
          nvidia.com/gpumem: 3000
"""
CONFIG_MAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  a: b
"""


def failing_on(name: str):
    """webhook.admission.objects.decide_object, except that it raises for the object named
    ``name``: the engine failing on a malformed object, however it is hardened meanwhile."""
    from webhook.admission.objects import decide_object

    def fake(obj, *args, **kwargs):
        if isinstance(obj, dict) and (obj.get("metadata") or {}).get("name") == name:
            raise RuntimeError("the engine broke\non two lines")
        return decide_object(obj, *args, **kwargs)

    return fake
