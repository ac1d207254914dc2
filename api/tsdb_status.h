/* tsdb_status — GET /api/v1/status/tsdb (Prometheus shape) over the storage engine. */
#ifndef SLUICE_API_TSDB_STATUS_H
#define SLUICE_API_TSDB_STATUS_H

#include "storage/storage.h"

void api_tsdb_status_register(storage_t *st);

#endif
