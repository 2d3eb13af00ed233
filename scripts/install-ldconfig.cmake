# Run by `cmake --install` (make install) after libaccel.so is in place, with
# CMAKE_INSTALL_PREFIX and ACCEL_INSTALL_LIBDIR set.
#
# A program linked with -laccel finds libaccel.so.0 at run time only through the loader's
# cache (ld.so.cache, rebuilt by ldconfig), its own rpath, or LD_LIBRARY_PATH. So: when the
# library folder is one the loader searches (ld.so.conf: /usr/local/lib, /usr/lib/<triplet>,
# ...), rebuild the cache; otherwise say how to run such programs (README: "Using the library").
# A DESTDIR install stages a package, whose own installation runs ldconfig: nothing to do.
if(NOT "$ENV{DESTDIR}" STREQUAL "")
  return()
endif()
if(IS_ABSOLUTE "${ACCEL_INSTALL_LIBDIR}")
  set(libdir "${ACCEL_INSTALL_LIBDIR}")
else()
  set(libdir "${CMAKE_INSTALL_PREFIX}/${ACCEL_INSTALL_LIBDIR}")
endif()
file(REAL_PATH "${libdir}" libdir_real)
# `ldconfig -N -v` lists the folders it scans (without rebuilding anything) as lines
# "DIR: (from FILE:LINE)"; the libraries found in each follow on tab-indented lines. Without
# ldconfig (not glibc's loader) nothing is known to be searched: only the hint is printed.
find_program(ACCEL_LDCONFIG ldconfig PATHS /sbin /usr/sbin)
set(scanned "")
if(ACCEL_LDCONFIG)
  execute_process(COMMAND "${ACCEL_LDCONFIG}" -N -v OUTPUT_VARIABLE scanned ERROR_QUIET)
endif()
string(REPLACE "\n" ";" scanned "${scanned}")
set(searched FALSE)
foreach(line IN LISTS scanned)
  if(line MATCHES "^([^\t][^:]*):")
    file(REAL_PATH "${CMAKE_MATCH_1}" dir)
    if(dir STREQUAL libdir_real)
      set(searched TRUE)
    endif()
  endif()
endforeach()

if(searched)
  execute_process(COMMAND "${ACCEL_LDCONFIG}" RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(STATUS "accel: ran ldconfig: programs linked with -laccel find ${libdir}/libaccel.so")
  else()
    message(WARNING "accel: ldconfig failed (${err}); run it as root so that programs linked "
                    "with -laccel find ${libdir}/libaccel.so")
  endif()
else()
  message(STATUS "accel: ${libdir} is not a folder the dynamic loader searches: link programs "
                 "with -Wl,-rpath,${libdir} (or run them with LD_LIBRARY_PATH=${libdir}); "
                 "README.md, \"Using the library\"")
endif()
