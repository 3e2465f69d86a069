/* An independent counter of the application's VMM memory (issue 15), to check poolshim's
 * `vmm_physical_bytes_peak` against: the peak of live cuMemCreate bytes (created and not yet
 * released) as CUPTI's driver-API callbacks see them.
 *
 * It shares nothing with poolshim's interception: the driver loads it itself at cuInit
 * (CUDA_INJECTION64_PATH=vmm_probe.so calls InitializeInjection), and CUPTI reports every
 * cuMemCreate/cuMemRelease that reaches the driver, however the caller found the function
 * (link, dlsym, cuGetProcAddress, cudaGetDriverEntryPoint). Run it where poolshim makes no VMM
 * calls of its own (observe mode), or its pages count too.
 *
 * At exit it writes one line to $VMM_PROBE_DIR/probe-<pid>.txt:
 *   creates C releases R live L peak P lost X
 * (lost: handles it could not keep in its table, or releases of handles it never saw).
 */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

enum { kSlots = 1 << 16 };
static const unsigned long long kEmpty = 0, kGone = ~0ULL;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  unsigned long long handle;
  size_t bytes;
} g_table[kSlots];
static unsigned long long g_live, g_peak, g_creates, g_releases, g_lost;

static size_t slot_of(unsigned long long handle) {
  return (size_t)((handle * 0x9E3779B97F4A7C15ULL) >> 48) & (kSlots - 1);
}

static void add(unsigned long long handle, size_t bytes) {
  ++g_creates;
  for (size_t i = 0, s = slot_of(handle); i < kSlots; ++i, s = (s + 1) & (kSlots - 1)) {
    if (g_table[s].handle == kEmpty || g_table[s].handle == kGone) {
      g_table[s].handle = handle;
      g_table[s].bytes = bytes;
      g_live += bytes;
      if (g_live > g_peak) g_peak = g_live;
      return;
    }
  }
  ++g_lost;
}

static void drop(unsigned long long handle) {
  ++g_releases;
  for (size_t i = 0, s = slot_of(handle); i < kSlots; ++i, s = (s + 1) & (kSlots - 1)) {
    if (g_table[s].handle == kEmpty) break;
    if (g_table[s].handle == handle) {
      g_live -= g_table[s].bytes;
      g_table[s].handle = kGone;
      return;
    }
  }
  ++g_lost;
}

static void CUPTIAPI on_call(void* user, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                             const void* data) {
  (void)user;
  const CUpti_CallbackData* call = (const CUpti_CallbackData*)data;
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API || call->callbackSite != CUPTI_API_EXIT) return;
  if (*(const CUresult*)call->functionReturnValue != CUDA_SUCCESS) return;
  pthread_mutex_lock(&g_lock);
  if (id == CUPTI_DRIVER_TRACE_CBID_cuMemCreate) {
    const cuMemCreate_params* p = (const cuMemCreate_params*)call->functionParams;
    add(*p->handle, p->size);
  } else if (id == CUPTI_DRIVER_TRACE_CBID_cuMemRelease) {
    drop(((const cuMemRelease_params*)call->functionParams)->handle);
  }
  pthread_mutex_unlock(&g_lock);
}

static void write_counts(void) {
  const char* dir = getenv("VMM_PROBE_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/probe-%d.txt", dir ? dir : ".", (int)getpid());
  FILE* f = fopen(path, "w");
  if (f == NULL) return;
  pthread_mutex_lock(&g_lock);
  fprintf(f, "creates %llu releases %llu live %llu peak %llu lost %llu\n", g_creates, g_releases,
          g_live, g_peak, g_lost);
  pthread_mutex_unlock(&g_lock);
  fclose(f);
}

/* Called by the driver at cuInit when CUDA_INJECTION64_PATH names this library. */
__attribute__((visibility("default"))) int InitializeInjection(void) {
  CUpti_SubscriberHandle subscriber;
  if (cuptiSubscribe(&subscriber, on_call, NULL) != CUPTI_SUCCESS ||
      cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API,
                          CUPTI_DRIVER_TRACE_CBID_cuMemCreate) != CUPTI_SUCCESS ||
      cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API,
                          CUPTI_DRIVER_TRACE_CBID_cuMemRelease) != CUPTI_SUCCESS) {
    fprintf(stderr, "vmm_probe: CUPTI refused the subscription\n");
    return 0;
  }
  atexit(write_counts);
  return 1;
}
