# cmake -DAR=... -DMRI=... -P merge_archives.cmake: runs `ar -M` on an MRI script (CREATE, ADDLIB
# per part, SAVE), which add_custom_command cannot feed on standard input.
execute_process(COMMAND ${AR} -M INPUT_FILE ${MRI} RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "ar -M ${MRI} failed: ${result}")
endif()
