# The installable library (find_package(outlive CONFIG) -> outlive::outlive, or pkg-config
# outlive): every internal static library merged into one archive, liboutlive.a, with the public
# headers of include/outlive/. The internal headers are not installed; the public ones include
# only each other, nlohmann/json and pqxx.
set(OUTLIVE_LIBRARY_PARTS
  outlive_replica outlive_http outlive_session outlive_subscriptions outlive_fanout outlive_access
  outlive_admission outlive_auth outlive_hooks outlive_jwt outlive_http_client outlive_publisher outlive_window outlive_topic outlive_cursor
  outlive_outbox outlive_migrations_sql outlive_db outlive_metrics outlive_config
  outlive_config_schema outlive_schema outlive_http_routes outlive_sse outlive_sse_framing outlive_ws_connection outlive_ws_framing outlive_tab_protocol outlive_common)
set(OUTLIVE_ARCHIVE ${PROJECT_BINARY_DIR}/liboutlive.a)
set(mri "CREATE ${OUTLIVE_ARCHIVE}\n")
foreach(part IN LISTS OUTLIVE_LIBRARY_PARTS)
  string(APPEND mri "ADDLIB $<TARGET_FILE:${part}>\n")
endforeach()
string(APPEND mri "SAVE\nEND\n")
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/liboutlive.mri CONTENT "${mri}")
add_custom_command(
  OUTPUT ${OUTLIVE_ARCHIVE}
  COMMAND ${CMAKE_COMMAND} -E rm -f ${OUTLIVE_ARCHIVE}
  COMMAND ${CMAKE_COMMAND} -DAR=${CMAKE_AR} -DMRI=${PROJECT_BINARY_DIR}/liboutlive.mri
          -P ${PROJECT_SOURCE_DIR}/cmake/merge_archives.cmake
  DEPENDS ${OUTLIVE_LIBRARY_PARTS} ${PROJECT_BINARY_DIR}/liboutlive.mri
  COMMENT "Merging the outlive libraries into liboutlive.a")
add_custom_target(outlive_library ALL DEPENDS ${OUTLIVE_ARCHIVE})

# In the source tree (the inventory demo) the same target name as installed, over the parts.
add_library(outlive_embedding INTERFACE)
target_include_directories(outlive_embedding INTERFACE ${PROJECT_SOURCE_DIR}/include)
target_link_libraries(outlive_embedding INTERFACE outlive_replica outlive_outbox)
add_library(outlive::outlive ALIAS outlive_embedding)

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(FILES ${OUTLIVE_ARCHIVE} DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/outlive DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS outlive RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# liburing when the build found it (src/ws/send_batch.cpp); both files list it for the linker.
set(OUTLIVE_URING_PC "")
if(URING_FOUND)
  set(OUTLIVE_URING_PC "liburing")
endif()
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/outliveConfig.cmake.in ${PROJECT_BINARY_DIR}/outliveConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/outlive
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/outliveConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/outliveConfig.cmake ${PROJECT_BINARY_DIR}/outliveConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/outlive)
configure_file(${PROJECT_SOURCE_DIR}/cmake/outlive.pc.in ${PROJECT_BINARY_DIR}/outlive.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/outlive.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
