/* tsdb_status — GET /api/v1/status/tsdb (Prometheus shape) over the storage engine. */
#ifndef SLUICE_API_TSDB_STATUS_H
#define SLUICE_API_TSDB_STATUS_H

#include "storage/storage.h"
#include "api/server.h"

void api_tsdb_status_register_routes(storage_t *st, api_server_t *srv);

#endif
