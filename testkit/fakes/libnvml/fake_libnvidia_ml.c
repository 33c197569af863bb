/*
 * A fake libnvidia-ml.so.1: the NVIDIA driver library at the narrowest boundary.
 *
 * The real nvidia-ml-py (pynvml) loads this with ctypes exactly as it loads the driver's
 * library, so the agent runs through pynvml's own wrappers, ctypes structures and error
 * mapping; only the driver behind them is fake. It exports the functions the agent
 * calls (agent/nvml_sampler.py) and nothing else, with the driver's C signatures and
 * struct layouts (nvml.h). Readings are deterministic per GPU index; the NVLink and
 * PCIe byte counters grow on every read, like the driver's cumulative counters.
 *
 * Initialisation is reference counted, as the driver's is: every nvmlInit needs its
 * nvmlShutdown, and only the first nvmlInit reads the configuration.
 * Configured from the environment at the first nvmlInitWithFlags():
 *   FAKE_LIBNVML_GPUS        number of GPUs (default 2)
 *   FAKE_LIBNVML_FAILING     comma-separated indexes that answer NVML_ERROR_GPU_IS_LOST
 *   FAKE_LIBNVML_NO_NVLINK   indexes whose NVLink fields answer NVML_ERROR_NOT_SUPPORTED
 *   FAKE_LIBNVML_NO_POWER    indexes whose power reading answers NVML_ERROR_NOT_SUPPORTED
 *   FAKE_LIBNVML_NO_UTILIZATION  indexes whose utilization reading answers
 *                            NVML_ERROR_NOT_SUPPORTED (as with MIG mode enabled)
 * fakeNvmlResetDevice(index) zeroes one GPU's NVLink and PCIe counters (a device reset).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_GPU_IS_LOST 15

#define NVML_CLOCK_SM 1
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX 139
#define NVML_FI_DEV_PCIE_COUNT_TX_BYTES 197
#define NVML_FI_DEV_PCIE_COUNT_RX_BYTES 198
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3

#define MAX_GPUS 64
#define NVLINK_KIB_PER_READ 1024ULL
#define PCIE_BYTES_PER_READ 1000000ULL
#define GIB (1024ULL * 1024ULL * 1024ULL)

typedef int nvmlReturn_t;

typedef struct fake_gpu {
    unsigned index;
    int failing;
    int has_nvlink;
    int has_power;
    int has_utilization;
    unsigned long long nvlink_tx_kib;
    unsigned long long nvlink_rx_kib;
    unsigned long long pcie_tx_bytes;
    unsigned long long pcie_rx_bytes;
} fake_gpu;

typedef fake_gpu *nvmlDevice_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

static fake_gpu gpus[MAX_GPUS];
static unsigned gpu_count;
static unsigned initialized;  /* nvmlInit calls not yet matched by nvmlShutdown */

static int listed(const char *variable, unsigned index) {
    const char *list = getenv(variable);
    if (list == NULL) {
        return 0;
    }
    while (*list) {
        char *end;
        unsigned long value = strtoul(list, &end, 10);
        if (end == list) {
            list++;
            continue;
        }
        if (value == index) {
            return 1;
        }
        list = end;
    }
    return 0;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (initialized++) {
        return NVML_SUCCESS;
    }
    const char *count = getenv("FAKE_LIBNVML_GPUS");
    gpu_count = count ? (unsigned)strtoul(count, NULL, 10) : 2;
    if (gpu_count > MAX_GPUS) {
        gpu_count = MAX_GPUS;
    }
    for (unsigned i = 0; i < gpu_count; i++) {
        gpus[i].index = i;
        gpus[i].failing = listed("FAKE_LIBNVML_FAILING", i);
        gpus[i].has_nvlink = !listed("FAKE_LIBNVML_NO_NVLINK", i);
        gpus[i].has_power = !listed("FAKE_LIBNVML_NO_POWER", i);
        gpus[i].has_utilization = !listed("FAKE_LIBNVML_NO_UTILIZATION", i);
        gpus[i].nvlink_tx_kib = 0;
        gpus[i].nvlink_rx_kib = 0;
        gpus[i].pcie_tx_bytes = 0;
        gpus[i].pcie_rx_bytes = 0;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) {
        return NVML_ERROR_UNINITIALIZED;
    }
    initialized--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

void fakeNvmlResetDevice(unsigned int index) {
    if (index < MAX_GPUS) {
        gpus[index].nvlink_tx_kib = 0;
        gpus[index].nvlink_rx_kib = 0;
        gpus[index].pcie_tx_bytes = 0;
        gpus[index].pcie_rx_bytes = 0;
    }
}

static nvmlReturn_t check(nvmlDevice_t device) {
    if (!initialized) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (device == NULL || device < gpus || device >= gpus + gpu_count) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return device->failing ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) {
        return NVML_ERROR_UNINITIALIZED;
    }
    *count = gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (index >= gpu_count) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t ret = check(device);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    int written = snprintf(name, length, "Fake GPU %u (tokenpath test driver)", device->index);
    return written < 0 || (unsigned)written >= length ? NVML_ERROR_INSUFFICIENT_SIZE
                                                       : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates) {
    nvmlReturn_t ret = check(device);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (!device->has_utilization) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    rates->gpu = (10 * (device->index + 1)) % 101;
    rates->memory = (5 * (device->index + 1)) % 101;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t ret = check(device);
    if (ret == NVML_SUCCESS) {
        memory->total = 80 * GIB;
        memory->used = (device->index + 1) * GIB;
        memory->free = memory->total - memory->used;
    }
    return ret;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts) {
    nvmlReturn_t ret = check(device);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (!device->has_power) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *milliwatts = 300000 + 1000 * device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *mhz) {
    nvmlReturn_t ret = check(device);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (type != NVML_CLOCK_SM) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *mhz = 1980;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count,
                                      nvmlFieldValue_t *values) {
    nvmlReturn_t ret = check(device);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *field = &values[i];
        field->timestamp = 0;
        field->latencyUsec = 0;
        field->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        field->value.ullVal = 0;
        unsigned id = field->fieldId;
        int nvlink_field = id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
                           || id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
        if (nvlink_field && !device->has_nvlink) {
            field->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        } else if (id == NVML_FI_DEV_PCIE_COUNT_TX_BYTES) {
            device->pcie_tx_bytes += PCIE_BYTES_PER_READ * (device->index + 1);
            field->value.ullVal = device->pcie_tx_bytes;
            field->nvmlReturn = NVML_SUCCESS;
        } else if (id == NVML_FI_DEV_PCIE_COUNT_RX_BYTES) {
            device->pcie_rx_bytes += 2 * PCIE_BYTES_PER_READ * (device->index + 1);
            field->value.ullVal = device->pcie_rx_bytes;
            field->nvmlReturn = NVML_SUCCESS;
        } else if (id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX) {
            device->nvlink_tx_kib += NVLINK_KIB_PER_READ * (device->index + 1);
            field->value.ullVal = device->nvlink_tx_kib;
            field->nvmlReturn = NVML_SUCCESS;
        } else if (id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) {
            device->nvlink_rx_kib += 2 * NVLINK_KIB_PER_READ * (device->index + 1);
            field->value.ullVal = device->nvlink_rx_kib;
            field->nvmlReturn = NVML_SUCCESS;
        } else {
            field->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}
