/* An NVTX injection library for the tests (e2e cases nvtx_*): what Nsight Systems' is to a
 * profiled program, without the profiler. NVTX's first call in a process with
 * NVTX_INJECTION64_PATH naming this file dlopens it and calls InitializeInjectionNvtx2 (nvtx3's
 * nvtxDetail/nvtxInit.h); this installs the domain calls of the CORE2 module and appends one
 * line per call to the file named by NVTX_RECORDER_FILE, tab-separated:
 *
 *   create    DOMAIN
 *   category  DOMAIN  ID  NAME
 *   register  DOMAIN  TEXT
 *   mark      DOMAIN  CATEGORY  COLOR  MESSAGE  PAYLOAD
 *   push      DOMAIN  CATEGORY  COLOR  MESSAGE  PAYLOAD
 *   pop       DOMAIN
 *   start     DOMAIN  CATEGORY  COLOR  MESSAGE  PAYLOAD  ID
 *   end       DOMAIN  ID
 *
 * COLOR is ARGB in hex (- when none); MESSAGE a registered string's text or the ASCII text;
 * PAYLOAD TYPE:VALUE (u64, i64, u32, i32) or -. Without NVTX_RECORDER_FILE it refuses to
 * initialize, and NVTX then treats every call as a no-op. Every copy of NVTX in the process
 * (the shim's, the application's) initializes it, each for its own function table. */
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct nvtxDomainRegistration_st {
  char name[128];
};

struct nvtxStringRegistration_st {
  const struct nvtxDomainRegistration_st* domain;
  char text[256];
};

// Domains and strings live in static tables, not on the heap: a program that exits without
// destroying its domain (an error path) leaks nothing that LeakSanitizer would report.
static struct nvtxDomainRegistration_st g_domains[16];
static struct nvtxStringRegistration_st g_strings[256];
static unsigned g_domain_count, g_string_count;  // under g_mutex

static FILE* g_file;
static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;
static nvtxRangeId_t g_next_range = 1;

static const char* domain_name(nvtxDomainHandle_t domain) {
  return domain != NULL ? domain->name : "(default)";
}

/* "CATEGORY\tCOLOR\tMESSAGE\tPAYLOAD" of an event's attributes into `out`. */
static void describe(const nvtxEventAttributes_t* a, char* out, size_t size) {
  char color[16] = "-";
  char payload[64] = "-";
  const char* message = "-";
  if (a->colorType == NVTX_COLOR_ARGB) snprintf(color, sizeof color, "%08x", a->color);
  if (a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii != NULL) {
    message = a->message.ascii;
  } else if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED && a->message.registered != NULL) {
    message = a->message.registered->text;
  }
  switch (a->payloadType) {
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT64:
      snprintf(payload, sizeof payload, "u64:%llu", (unsigned long long)a->payload.ullValue);
      break;
    case NVTX_PAYLOAD_TYPE_INT64:
      snprintf(payload, sizeof payload, "i64:%lld", (long long)a->payload.llValue);
      break;
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT32:
      snprintf(payload, sizeof payload, "u32:%u", a->payload.uiValue);
      break;
    case NVTX_PAYLOAD_TYPE_INT32:
      snprintf(payload, sizeof payload, "i32:%d", a->payload.iValue);
      break;
    default:
      break;
  }
  snprintf(out, size, "%u\t%s\t%s\t%s", a->category, color, message, payload);
}

static void record(const char* line) {
  pthread_mutex_lock(&g_mutex);
  fputs(line, g_file);
  fputc('\n', g_file);
  fflush(g_file);
  pthread_mutex_unlock(&g_mutex);
}

static nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  struct nvtxDomainRegistration_st* d = NULL;
  char line[256];
  pthread_mutex_lock(&g_mutex);
  if (g_domain_count < sizeof g_domains / sizeof g_domains[0]) d = &g_domains[g_domain_count++];
  pthread_mutex_unlock(&g_mutex);
  if (d == NULL) return NULL;
  snprintf(d->name, sizeof d->name, "%s", name);
  snprintf(line, sizeof line, "create\t%s", d->name);
  record(line);
  return d;
}

static void NVTX_API name_category(nvtxDomainHandle_t domain, uint32_t id, const char* name) {
  char line[512];
  snprintf(line, sizeof line, "category\t%s\t%u\t%s", domain_name(domain), id, name);
  record(line);
}

static nvtxStringHandle_t NVTX_API register_string(nvtxDomainHandle_t domain, const char* text) {
  struct nvtxStringRegistration_st* s = NULL;
  char line[512];
  pthread_mutex_lock(&g_mutex);
  if (g_string_count < sizeof g_strings / sizeof g_strings[0]) s = &g_strings[g_string_count++];
  pthread_mutex_unlock(&g_mutex);
  if (s == NULL) return NULL;
  s->domain = domain;
  snprintf(s->text, sizeof s->text, "%s", text);
  snprintf(line, sizeof line, "register\t%s\t%s", domain_name(domain), s->text);
  record(line);
  return s;
}

static void event(const char* kind, nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a,
                  const char* suffix) {
  char attributes[768];
  char line[1024];
  describe(a, attributes, sizeof attributes);
  snprintf(line, sizeof line, "%s\t%s\t%s%s", kind, domain_name(domain), attributes, suffix);
  record(line);
}

static void NVTX_API mark(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  event("mark", domain, a, "");
}

static int NVTX_API push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  event("push", domain, a, "");
  return 0;
}

static int NVTX_API pop(nvtxDomainHandle_t domain) {
  char line[256];
  snprintf(line, sizeof line, "pop\t%s", domain_name(domain));
  record(line);
  return 0;
}

static nvtxRangeId_t NVTX_API start(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  char suffix[32];
  nvtxRangeId_t id;
  pthread_mutex_lock(&g_mutex);
  id = g_next_range++;
  pthread_mutex_unlock(&g_mutex);
  snprintf(suffix, sizeof suffix, "\t%llu", (unsigned long long)id);
  event("start", domain, a, suffix);
  return id;
}

static void NVTX_API end(nvtxDomainHandle_t domain, nvtxRangeId_t id) {
  char line[256];
  snprintf(line, sizeof line, "end\t%s\t%llu", domain_name(domain), (unsigned long long)id);
  record(line);
}

static int install(NvtxFunctionTable table, unsigned int size, unsigned int id,
                   NvtxFunctionPointer f) {
  if (id > size || table[id] == NULL) return 0;
  *table[id] = f;
  return 1;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  const char* path = getenv("NVTX_RECORDER_FILE");
  const NvtxExportTableCallbacks* callbacks;
  NvtxFunctionTable table = NULL;
  unsigned int size = 0;
  if (path == NULL || path[0] == '\0') return 0;
  callbacks = (const NvtxExportTableCallbacks*)get_export_table(NVTX_ETID_CALLBACKS);
  if (callbacks == NULL ||
      !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size)) {
    return 0;
  }
  /* Each copy of NVTX in the process (the shim's, the application's) initializes it once. */
  pthread_mutex_lock(&g_mutex);
  if (g_file == NULL) g_file = fopen(path, "a");
  pthread_mutex_unlock(&g_mutex);
  if (g_file == NULL) return 0;
  return install(table, size, NVTX_CBID_CORE2_DomainCreateA, (NvtxFunctionPointer)domain_create) &&
         install(table, size, NVTX_CBID_CORE2_DomainNameCategoryA,
                 (NvtxFunctionPointer)name_category) &&
         install(table, size, NVTX_CBID_CORE2_DomainRegisterStringA,
                 (NvtxFunctionPointer)register_string) &&
         install(table, size, NVTX_CBID_CORE2_DomainMarkEx, (NvtxFunctionPointer)mark) &&
         install(table, size, NVTX_CBID_CORE2_DomainRangePushEx, (NvtxFunctionPointer)push) &&
         install(table, size, NVTX_CBID_CORE2_DomainRangePop, (NvtxFunctionPointer)pop) &&
         install(table, size, NVTX_CBID_CORE2_DomainRangeStartEx, (NvtxFunctionPointer)start) &&
         install(table, size, NVTX_CBID_CORE2_DomainRangeEnd, (NvtxFunctionPointer)end);
}
