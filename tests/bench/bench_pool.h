// What the benchmark programs share: a pool made as poolshim makes its own.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

/// A pool set up like poolshim's (pool/device_pool.cpp), so that the comparison with the shim's
/// cudaMallocAsync measures the hook path and not a different pool configuration.
inline cudaMemPool_t make_pool_like_poolshim(int device) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  CHECK_CUDA(cudaMemPoolCreate(&pool, &props));
  std::uint64_t keep_everything = UINT64_MAX;
  int on = 1, off = 0;
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseFollowEventDependencies, &on));
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &on));
  CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &off));
  return pool;
}
