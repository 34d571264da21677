from fireviz.cli import main
from fireviz.core.distributed import exit_process

exit_process(main())
