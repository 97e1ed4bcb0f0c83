// Internal to e8kv::store: the backends' constructors.
#pragma once

#include <memory>
#include <string>

#include "e8kv/store/store.hpp"

namespace e8kv::store {

std::unique_ptr<Store> open_redis_store(const std::string& address, const StoreAddress& where,
                                        const StoreOptions& options);

}  // namespace e8kv::store
