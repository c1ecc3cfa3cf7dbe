#!/bin/bash
# Why does NVIDIA's Vulkan ICD refuse an instance here? Try variants; run the
# full measurement (gpu.sh) with the first that gives wgpu an adapter.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib
gunzip -c arbor.gz > /tmp/a; chmod +x /tmp/a
/tmp/a bench random-model --shape qwen2.5-0.5b --out /tmp/s.gguf 2>/dev/null
ls -la /dev/nvidia* /dev/dri 2>&1 | head; 
LD_DEBUG=libs timeout 30 /tmp/a bench decode --model /tmp/s.gguf --backend wgpu --tokens 1 --prompt-tokens 2 2>&1 | grep -iE "cannot|error|not found|failed" | grep -v "^.*calling" | head -15
cat > /tmp/nvidia_egl_icd.json <<'J'
{ "file_format_version" : "1.0.1", "ICD": { "library_path": "libEGL_nvidia.so.0", "api_version" : "1.4.312" } }
J
try() { echo "== $*"; env "$@" timeout 40 /tmp/a bench decode --model /tmp/s.gguf --backend wgpu --tokens 2 --prompt-tokens 4 > /tmp/d.json 2>/tmp/d.err; rc=$?; tail -c 400 /tmp/d.err | grep -E "Unable|adapter|panicked" | head -2; cat /tmp/d.json; return $rc; }
for v in "VK_ICD_FILENAMES=/tmp/nvidia_egl_icd.json" "X=1" "VK_ICD_FILENAMES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json" "__GL_SYNC_TO_VBLANK=0 __NV_PRIME_RENDER_OFFLOAD=1" "WGPU_BACKEND=gl" "WGPU_BACKEND=vulkan VK_DRIVER_FILES=/usr/share/vulkan/icd.d/nvidia_icd.json"; do
  if try $v; then echo "WORKS: $v"; export $v; exec bash ./gpu.sh; fi
done
echo "no variant gave an adapter"
